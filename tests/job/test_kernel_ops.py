"""Issue 27 item 10: on CUDA, ops.csv's kernel rows are joined to the ops that launched them by correlation ids.

The trace is a real one: torch.profiler's Chrome trace of AlexNet's forward on an A100 (CUDA 11-era kineto), from
HolisticTraceAnalysis' test data (tests/fixtures/hta_alexnet_a100_trace.json.gz, MIT licence, Meta Platforms). Its
harness wraps every op in `[param|...]` user annotations; mtbench's own jobs have none, so the tests drop them.
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from mtbench.job import kernel_ops
from mtbench.job.profile import top_level
from mtbench.predict.opcost import measured_class

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "hta_alexnet_a100_trace.json.gz"


@pytest.fixture(scope="module")
def events():
    with gzip.open(TRACE, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if not (e.get("cat") == "user_annotation" and e["name"].startswith("[param"))]


def test_every_kernel_is_named_by_the_op_that_launched_it(events):
    ops, kernels, table = top_level(events, offset=0.0)
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in kernel_ops.DEVICE_CATS]
    assert len(kernels) == len(device) == 98 and all(k.device == "cuda" for k in kernels)
    names = Counter(k.name for k in kernels)
    # the convolutions' cuDNN kernels, layout transposes and bias adds are all aten::conv2d's GPU time
    assert names["aten::conv2d"] == 41 and names["aten::linear"] == 14 and names["aten::max_pool2d"] == 6
    assert names["aten::to"] == 16  # the host-to-device copies
    assert not any(n.startswith(("void ", "ampere_", "cudnn")) for n in names)  # no kernel left unjoined
    # the GPU time is conserved: each op's kernel rows add up to every kernel's time
    by_kernel = sum(r[3] for r in table)
    assert by_kernel == pytest.approx(sum(e["dur"] for e in device) / 1e6)
    conv = {r[0] for r in table if r[1] == "aten::conv2d"}
    assert "cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1" in conv
    assert any("sgemm" in r[0] for r in table if r[1] == "aten::linear")
    # the host rows are the same ops
    assert {"aten::conv2d", "aten::linear", "aten::max_pool2d"} <= {o.name for o in ops}


def test_a_kernel_whose_launch_is_missing_keeps_its_name_and_says_why(events):
    launches = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"
                and e["name"] == "cudaLaunchKernel" and "correlation" in e.get("args", {})}
    gone = min(launches)
    trimmed = [e for e in events if not (e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") == gone)]
    _, kernels, table = top_level(trimmed, offset=0.0)
    orphan = next(e for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] == gone)
    assert orphan["name"] in {k.name for k in kernels}
    assert [r[1] for r in table if r[0] == orphan["name"] and r[1].startswith("[")] == ["[launch not in the trace]"]


def test_op_named_gpu_rows_fall_in_the_ops_class_not_the_kernels():
    assert measured_class("aten::conv2d", "cuda") == "conv"  # its bias-add kernels included
    assert measured_class("ConvolutionBackward0", "cuda") == "conv"
    assert measured_class("aten::linear", "cuda") == "matmul"
    assert measured_class("void at::native::vectorized_elementwise_kernel<4, ...>", "cuda") == "elementwise"
    assert measured_class("ampere_sgemm_32x32_sliced1x4_tn", "cuda") == "matmul"
