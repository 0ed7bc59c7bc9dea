"""MKL's kept product buffers, predicted by replaying the traced products on this host's MKL, against what a job's
own process counts with MKL's statistics."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from mtbench import config
from mtbench.predict import mkl_buffers
from mtbench.predict.predictor import Predictor
from tests.helpers.compose import FAKE
from tests.helpers.env import child_env

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch is built without MKL")
PROJECTION = [*FAKE[1:], "model.workload._target_=tests.fake_workloads.Projection"]


def test_the_products_mkl_runs_are_noted_capped():
    products = []
    a, w = torch.zeros(4096, 3072), torch.zeros(3072, 768)
    mkl_buffers.note(products, torch.ops.aten.mm.default, (a, w))
    mkl_buffers.note(products, torch.ops.aten.addmm.default, (torch.zeros(768), a, w))
    mkl_buffers.note(products, torch.ops.aten.bmm.default, (torch.zeros(96, 384, 64), torch.zeros(96, 64, 384)))
    mkl_buffers.note(products, torch.ops.aten.mv.default, (w, torch.zeros(768)))  # no buffers: not a product here
    mkl_buffers.note(products, torch.ops.aten.mm.default, (a.double(), w.double()))  # MKL's dgemm: not counted
    assert products == [(0, 1024, 1024, 768), (0, 1024, 1024, 768), (2, 384, 64, 384)]


# a job in a fresh process (MKL's pool holds nothing of other tests), its workload one of the tests'
JOB = r"""
import json, sys
from pathlib import Path
from mtbench import config
from mtbench.job.run import run_job
from tests.helpers.compose import compose_cfg
config.ALLOWED_TARGET_PREFIXES += ("tests.",)
summary = run_job(compose_cfg(json.loads(sys.argv[1])), Path(sys.argv[2]))
print(json.dumps(summary["mem_mkl_bytes"]))
"""


def _job(tmp_path, *extra: str) -> int:
    overrides = [*FAKE, *PROJECTION[len(FAKE) - 1:], "batch=64", "device=cpu", "warmup=1", "steps=2",
                 "memory.breakdown=false", *extra]
    proc = subprocess.run([sys.executable, "-c", JOB, json.dumps(overrides), str(tmp_path / "job")],
                          capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_mkl
@pytest.mark.parametrize("malloc", ["auto", "live"])
def test_the_replay_gives_what_the_jobs_mkl_held(tmp_path, monkeypatch, malloc):
    """auto: the job measures its training memory in a thread of its own, whose OpenMP team makes buffers of its
    own beside the steps' (about twice the buffers); live: in its measured steps, which reuse the warm-up's."""
    measured = _job(tmp_path, f"memory.cpu_malloc={malloc}")
    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))
    predictor = Predictor(target_name="none", device="cpu",
                          overrides=(*PROJECTION, "warmup=1", "steps=2", f"memory.cpu_malloc={malloc}"))
    trace, _ = predictor.trace("squeezenet", 64)
    kept, why = predictor.mkl_kept(trace)
    assert predictor.measured_in_own_thread == (malloc == "auto")
    assert measured > 4 << 20 and kept is not None, (measured, why)
    assert kept == pytest.approx(measured, rel=0.1), (kept, measured)
    held, note = predictor.held_outside(trace)
    assert held == kept and "MKL keeps" in note


def test_without_mkls_statistics_nothing_is_counted_and_the_note_says_why(monkeypatch):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    monkeypatch.setattr(mkl_buffers.mkl_memory, "_PROCESS", None)
    kept, why = mkl_buffers.kept_bytes([(0, 64, 512, 7709)], [], own_thread=False)
    assert kept is None and "built without MKL" in why


@pytest.mark.parametrize("where", ["steps", "measured"])
def test_a_product_that_raises_is_raised_and_the_replay_ends(where):
    """A shape torch refuses (its own error, not one written here) in either thread: raised in the caller once both
    threads are done; before, the steps' thread died without telling the waiting one and the replay hung."""
    bad, good = [(0, -1, 4, 4)], [(0, 4, 4, 4)]
    steps, measured = (bad, good) if where == "steps" else (good, bad)
    outcome = []

    def replay() -> None:
        try:
            mkl_buffers._replay(mkl_buffers.mkl_memory.process(), steps, measured)
        except RuntimeError as exc:
            outcome.append(str(exc))

    caller = threading.Thread(target=replay, daemon=True)
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "the replay hung"
    assert outcome and "must be non-negative" in outcome[0], outcome
