"""One command on a machine with a CUDA GPU: the CUDA tests, a small measured matrix and the checks only a real GPU
can answer, printed as one table (issue 27 item 16). On a CPU-only machine every part runs that can, and each
CUDA part says that it was skipped.

    python benchmarks/gpu_check.py [--out DIR] [--budget-s 480]

From the repository root, after `pip install -e '.[test,nvidia]'` (a wheel set carried to the machine works the
same way). Parts, each with its own time limit (the whole run stays within --budget-s, 8 minutes by default):
  tests     tests/test_cuda.py, test_jetson_truth.py, test_memory_budget.py, test_nvml_truth.py (CUDA: all of them)
  matrix    3 models x 2 batches, measured (CUDA: batch 16 and 64, 10 steps, NVML; CPU: batch 1 and 2, 1 step)
  predict   the predictor's allocator peak against each CUDA job's max_memory_allocated
  tx2       VGG19 at 224x224 batch 64 under target=tx2's cap (5.5 GiB): must be "oom", as on the board
  energy    NVML: the steps' energies summed against the energy counter over the measured steps
  overhead  the sampler's cost: mtbench's step time over a bare loop's (benchmarks/overhead.py, process mode)
Exit 0 when no part failed (skipped parts do not fail), 1 otherwise.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
MODELS = ["squeezenet", "resnet50", "vgg16"]
TESTS = ["tests/test_cuda.py", "tests/test_jetson_truth.py", "tests/test_memory_budget.py", "tests/test_nvml_truth.py"]
TX2_JOB = ["model=vgg19", "model.workload.net.variant=imagenet", "data.image_size=224", "batch=64", "target=tx2"]


class Check:
    """The table: one row per check, status PASS / FAIL / SKIP / INFO."""

    def __init__(self, budget_s: float) -> None:
        self.rows: List[List[str]] = []
        self.deadline = time.monotonic() + budget_s

    def add(self, part: str, status: str, result: str) -> None:
        self.rows.append([part, status, result])
        print(f"[{status}] {part}: {result}", flush=True)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def failed(self) -> bool:
        return any(r[1] == "FAIL" for r in self.rows)

    def table(self) -> str:
        widths = [max(len(r[i]) for r in self.rows + [["part", "status", "result"]]) for i in range(2)]
        lines = [f"{'part':{widths[0]}}  {'status':{widths[1]}}  result"]
        lines += [f"{p:{widths[0]}}  {s:{widths[1]}}  {r}" for p, s, r in self.rows]
        return "\n".join(lines)


def run(cmd: List[str], timeout_s: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout_s:.0f} s")


def nvml_reason() -> Optional[str]:
    """None where NVML answers, else why not."""
    try:
        import pynvml
    except ImportError:
        return "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        return f"NVML does not start: {exc}"
    return None


def part_tests(check: Check, cuda: bool) -> None:
    if not cuda:
        check.add("tests", "SKIP", "CUDA tests: no CUDA GPU (test_cuda.py skips as a whole)")
        return
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *TESTS],
               min(300.0, check.left_s() - 200))
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    check.add("tests", "PASS" if proc.returncode == 0 else "FAIL", f"{' '.join(TESTS)}: {last}")
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")


def part_matrix(check: Check, cuda: bool, sampler: str, out: Path) -> List[Dict[str, Any]]:
    batches = "16,64" if cuda else "1,2"
    steps = ["warmup=2", "steps=10"] if cuda else ["warmup=0", "steps=1"]
    cmd = [sys.executable, "-m", "mtbench", "-m", f"model={','.join(MODELS)}", f"batch={batches}",
           f"device={'cuda' if cuda else 'cpu'}", f"sampler={sampler}", *steps, f"hydra.sweep.dir={out}",
           f"lock_dir={out}"]
    proc = run(cmd, min(240.0, check.left_s() - 120))
    summaries = [dict(json.loads(p.read_text()), _dir=str(p.parent)) for p in sorted(out.rglob("summary.json"))]
    ok = [s for s in summaries if s.get("success")]
    status = "PASS" if proc.returncode == 0 and len(ok) == 6 else "FAIL"
    check.add("matrix", status, f"{len(ok)} of 6 jobs succeeded on {'cuda' if cuda else 'cpu'} "
                                f"(sampler={sampler}){'' if proc.returncode == 0 else ': ' + proc.stderr[-300:]}")
    for s in sorted(summaries, key=lambda s: (s["model"], s["batch_size"])):
        step = (s.get("step_time_s") or {}).get("median")
        energy = (s.get("energy_j") or {}).get("per_step_mean")
        gpu = (s.get("gpu_util_pct") or {}).get("mean")
        fail = (s.get("failure") or {}).get("kind")
        check.add(f"  {s['model']} b{s['batch_size']}", "INFO" if s.get("success") else "FAIL",
                  f"step {_num(step, '.4f')} s, {_num(s.get('throughput_samples_per_s'), '.1f')} samples/s, "
                  f"peak {_mib(s.get('mem_peak_bytes'))} ({s.get('mem_peak_source')}), "
                  f"{_num(energy, '.3f')} J/step, GPU {_num(gpu, '.0f')} %" + (f", failed: {fail}" if fail else ""))
    return summaries


def part_predict(check: Check, cuda: bool, summaries: List[Dict[str, Any]]) -> None:
    if not cuda:
        check.add("predict", "SKIP", "predicted vs max_memory_allocated: no CUDA GPU")
        return
    try:
        from mtbench.predict.predictor import Predictor

        predictor = Predictor(target_name="none", device="cuda")
    except Exception as exc:  # torch < 2.5: no predictor
        check.add("predict", "SKIP", f"the predictor cannot run here: {type(exc).__name__}: {exc}")
        return
    for s in summaries:
        if not s.get("success") or s.get("mem_peak_source") != "cuda_allocator":
            continue
        try:
            p = predictor.predict(s["model"], s["batch_size"])
        except Exception as exc:
            check.add(f"predict {s['model']} b{s['batch_size']}", "FAIL", f"{type(exc).__name__}: {exc}")
            continue
        error = (p.tensors_bytes - s["mem_peak_bytes"]) / s["mem_peak_bytes"]
        check.add(f"predict {s['model']} b{s['batch_size']}", "PASS" if abs(error) < 0.10 else "FAIL",
                  f"predicted {_mib(p.tensors_bytes)} vs max_memory_allocated {_mib(s['mem_peak_bytes'])} "
                  f"({error:+.1%}; goal within 10 %)")


def part_tx2(check: Check, cuda: bool, out: Path) -> None:
    if not cuda:
        check.add("tx2", "SKIP", "target=tx2 capped job: no CUDA GPU (on CPU the cap is a peak check)")
        return
    cmd = [sys.executable, "-m", "mtbench", *TX2_JOB, "device=cuda", "warmup=1", "steps=1",
           f"hydra.run.dir={out}", f"lock_dir={out}"]
    proc = run(cmd, min(180.0, check.left_s() - 60))
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        check.add("tx2", "FAIL", f"no summary ({exc}); {proc.stderr[-300:]}")
        return
    kind = (s.get("failure") or {}).get("kind")
    check.add("tx2", "PASS" if kind == "oom" else "FAIL",
              f"{' '.join(TX2_JOB)}: {kind or 'fits'} under {_mib(s.get('budget_bytes'))} "
              f"({s.get('budget_enforced_by')}); the board cannot train it either")


def part_energy(check: Check, cuda: bool, nvml_why: Optional[str], summaries: List[Dict[str, Any]]) -> None:
    if not cuda or nvml_why:
        check.add("energy", "SKIP", f"NVML per-step energy vs the counter: {'no CUDA GPU' if not cuda else nvml_why}")
        return
    for s in summaries:
        energy = s.get("energy_j")
        if not s.get("success") or not energy or energy.get("total") is None:
            continue
        with open(Path(s["_dir"]) / "steps.csv") as f:
            rows = [r for r in csv.DictReader(f) if r["warmup"] in ("False", "false", "0")]
        per_step = [float(r["energy_j_total"]) for r in rows if r.get("energy_j_total")]
        name = f"energy {s['model']} b{s['batch_size']}"
        if len(per_step) < len(rows) or not rows:
            reasons = {r.get("energy_j_null_reason") for r in rows if not r.get("energy_j_total")}
            check.add(name, "INFO", f"{len(rows) - len(per_step)} of {len(rows)} steps without energy: "
                                    f"{'; '.join(sorted(x for x in reasons if x))[:200]}")
            continue
        ratio = sum(per_step) / energy["total"]
        sources = sorted(set((energy.get("source_by_rail") or {}).values()))
        check.add(name, "PASS" if abs(ratio - 1) < 0.05 else "FAIL",
                  f"steps' sum {sum(per_step):.2f} J vs {energy['total']:.2f} J over the job ({', '.join(sources)}): "
                  f"ratio {ratio:.3f} (goal within 5 %)")


def part_overhead(check: Check, cuda: bool) -> None:
    args = (["model=resnet50", "batch=32", "steps=10", "rounds=2", "device=cuda"] if cuda else
            ["model=squeezenet", "batch=1", "steps=3", "rounds=1", "device=cpu"])
    proc = run([sys.executable, "benchmarks/overhead.py", *args, "modes=process"], min(150.0, check.left_s() - 10))
    found = re.search(r"ratio ([0-9.]+) \(goal <= 1\.02\)", proc.stdout)
    if not found:
        check.add("overhead", "FAIL", f"benchmarks/overhead.py gave no ratio: {proc.stderr[-300:]}")
        return
    ratio = float(found.group(1))
    # a 3-step CPU run on a shared machine is a smoke test of the path, not a measurement
    status = ("PASS" if ratio <= 1.02 else "FAIL") if cuda else "INFO"
    check.add("overhead", status, f"mtbench / bare loop step time {ratio:.3f} ({' '.join(args)}, sampler.mode=process)")


def _num(value: Any, fmt: str) -> str:
    return "null" if value is None else format(value, fmt)


def _mib(value: Any) -> str:
    return "null" if value is None else f"{value / 2**20:.0f} MiB"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the jobs' results go (default: a temporary folder)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time, seconds")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # asking for a GPU does not start CUDA here
    import torch

    started = time.monotonic()
    out = args.out or Path(tempfile.mkdtemp(prefix="mtbench-gpu-check-"))
    cuda = torch.cuda.is_available()
    check = Check(args.budget_s)
    nvml_why = nvml_reason() if cuda else "no CUDA GPU"
    device = torch.cuda.get_device_name(0) if cuda else "none"
    check.add("machine", "INFO", f"GPU {device}; torch {torch.__version__}; NVML {nvml_why or 'answers'}; "
                                 f"results in {out}")
    part_tests(check, cuda)
    summaries = part_matrix(check, cuda, "nvml" if cuda and not nvml_why else "procfs", out / "matrix")
    part_predict(check, cuda, summaries)
    part_tx2(check, cuda, out / "tx2")
    part_energy(check, cuda, nvml_why, summaries)
    part_overhead(check, cuda)
    skipped = [r[0] for r in check.rows if r[1] == "SKIP"]
    print(f"\nmtbench gpu_check: {time.monotonic() - started:.0f} s; "
          + (f"skipped (CUDA parts): {', '.join(skipped)}" if skipped else "nothing skipped"))
    print(check.table())
    return 1 if check.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
