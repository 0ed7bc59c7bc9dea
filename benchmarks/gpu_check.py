"""One command on a machine with a CUDA GPU: the CUDA tests, a small measured matrix and the checks only a real GPU
can answer, printed as one table and written to one JSON file (issue 27 item 16, issue 49 item 3). On a CPU-only
machine every part runs that can, and each CUDA part says that it was skipped.

    python benchmarks/gpu_check.py [--out DIR] [--budget-s 480] [--wheels DIR]

From the repository root. It needs torch; mtbench's own dependencies (hydra-core, omegaconf, ...) where missing are
installed from the wheels in --wheels DIR (or benchmarks/wheels/), each without its dependencies, into a temporary
folder, else named with the one command that makes those wheels where there is a network, and the parts that need
them skipped (a machine with torch but no hydra-core still runs the probe). Parts, each with its
own time limit (the whole run stays within --budget-s, 8 minutes by default):
  deps      what mtbench needs and what was installed from the wheels
  probe     each NVML field's real update period, learned from 5 ms samples under a square-wave load on the GPU
            (0.5 s of matrix products, 0.5 s idle)
  tests     tests/device/test_cuda.py, sampling/test_jetson_truth.py, device/test_budget.py, sampling/test_nvml_truth.py
  matrix    3 models x 2 batches, measured (CUDA: batch 16 and 64, 10 steps, NVML; CPU: batch 1 and 2, 1 step)
  predict   like with like: the predicted allocated peak (tensors + cuBLAS's workspaces, which go through the
            caching allocator) against each CUDA job's max_memory_allocated, and the predicted reserved peak
            against max_memory_reserved
  tx2       VGG19 at 224x224 under target=tx2's cap (5.5 GiB): batch 64 must be "oom", as on the board, and
            batch 2 must fit (the control)
  energy    NVML: the mean power of the measured steps (their energies over their time) against the energy
            counter's over a window its own change points set, not the steps (within 5 %)
  overhead  the sampler's cost: mtbench's step time over a bare loop's (benchmarks/overhead.py, process mode)
A part that raises is that part's FAIL row and the others still run. Writes <out>/gpu_check.json (every row).
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
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
MODELS = ["squeezenet", "resnet50", "vgg16"]
TESTS = ["tests/device/test_cuda.py", "tests/sampling/test_jetson_truth.py", "tests/device/test_budget.py", "tests/sampling/test_nvml_truth.py"]
TX2_JOB = ["model=vgg19", "model.workload.net.variant=imagenet", "data.image_size=224", "target=tx2"]
# what `python -m mtbench` imports beyond torch: module -> the pip name
NEEDED = {"hydra": "hydra-core", "omegaconf": "omegaconf", "numpy": "numpy", "torchvision": "torchvision",
          "psutil": "psutil", "rich": "rich", "matplotlib": "matplotlib", "yaml": "PyYAML"}
# what those need that a machine with torch may not have, and the versions hydra-core 1.3 takes (pip --no-deps checks
# none): antlr4 4.9 is an sdist only, which `pip wheel` builds
ALSO = {"hydra-core": ("omegaconf", "antlr4-python3-runtime"), "omegaconf": ("antlr4-python3-runtime",)}
SPEC = {"hydra-core": "'hydra-core>=1.3,<1.4'", "omegaconf": "'omegaconf>=2.2,<2.4'",
        "antlr4-python3-runtime": "antlr4-python3-runtime==4.9.3"}


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

    def as_json(self, path: Path, machine: Dict[str, Any]) -> None:
        rows = [{"part": p.strip(), "status": st, "result": r} for p, st, r in self.rows]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machine, "rows": rows,
                                    "skipped": [r["part"] for r in rows if r["status"] == "SKIP"],
                                    "failed": [r["part"] for r in rows if r["status"] == "FAIL"]}, indent=1))

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


def missing_modules() -> List[str]:
    import importlib.util

    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def wanted(missing: List[str]) -> List[str]:
    """pip's requirements for the missing modules and for the pure-Python packages they need that pip will not find
    installed beside them (pip --target resolves against an empty folder)."""
    names = [NEEDED[m] for m in missing]
    names += sorted({d for n in names for d in ALSO.get(n, ())} - set(names))
    return [SPEC.get(n, n) for n in names]


def part_deps(check: Check, wheels: Optional[Path]) -> bool:
    """Whether mtbench's dependencies import here; where some are missing, every wheel in `wheels` is installed
    without dependencies into a temporary folder (put on this process's path and the subprocesses' PYTHONPATH), else the
    missing ones are named with the command that makes the wheels."""
    missing = missing_modules()
    files = sorted(str(w) for w in wheels.glob("*.whl")) if missing and wheels is not None and wheels.is_dir() else []
    if files:
        site = Path(tempfile.mkdtemp(prefix="mtbench-gpu-check-site-"))  # not in <out>: only results come back
        # --no-deps: pip --target would want every requirement (packaging, PyYAML) from the folder, even those
        # installed here; the folder holds what is missing, and the imports below say whether it was enough
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                               "--target", str(site), "--quiet", *files], capture_output=True, text=True)
        if proc.returncode == 0:
            sys.path.insert(0, str(site))
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
            check.add("deps", "INFO", f"installed from {wheels} into {site}: "
                                      + ", ".join(Path(f).name.split("-")[0] for f in files))
            missing = missing_modules()
        else:
            check.add("deps", "INFO", f"installing from {wheels} failed: {(proc.stderr.strip() or '?')[-300:]}")
    if missing:
        names = " ".join(wanted(missing))
        check.add("deps", "SKIP", f"missing {' '.join(NEEDED[m] for m in missing)}: the parts that run mtbench are "
                                  f"skipped; install with `pip install {names}` (no network here: where there is "
                                  f"one, `pip wheel --no-deps -w benchmarks/wheels {names}`, carry the folder)")
        return False
    # a module can be found and still not import (omegaconf without antlr4): import them all as mtbench's jobs will
    proc = run([sys.executable, "-c", "import " + ", ".join(NEEDED)], 120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        check.add("deps", "SKIP", f"mtbench's dependencies do not import: {last}; the parts that run mtbench "
                                  "are skipped")
        return False
    check.add("deps", "PASS", "mtbench's dependencies import: " + ", ".join(NEEDED.values()))
    return True


def part_probe(check: Check, cuda: bool, nvml_why: Optional[str], seconds: float = 8.0,
               busy: Optional[Callable[[float], None]] = None) -> None:
    """Each NVML field's update period as the samples show it under a square-wave load: `busy(0.5)` (matrix
    products on the GPU for 0.5 s), then 0.5 s idle (its value changes at least then); the shortest interval between
    changes (10th percentile) beside the period mtbench declares for it."""
    if not cuda or nvml_why:
        check.add("probe", "SKIP", f"sensor update periods: {'no CUDA GPU' if not cuda else nvml_why}")
        return
    import numpy as np

    from mtbench.sampling import Sampler, open_sensors
    from mtbench.sampling.resolution import learned_period_s

    sensors, _ = open_sensors(["nvml"], {"nvml": {}})
    sampler = Sampler(sensors, 5.0)
    busy = busy or gpu_busy()
    sampler.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        busy(0.5)
        time.sleep(0.5)
    samples = sampler.stop()
    for sensor in sensors:
        sensor.close()
    found = 0
    for f in samples.fields:
        values = np.asarray(samples.columns[f.name], dtype=float)
        if f.group not in ("power", "power_avg", "energy", "gpu_util") or np.all(np.isnan(values)):
            continue
        found += 1
        learned = learned_period_s(samples.time_s, values, 0.005)
        declared = f"{f.resolution_s * 1000:g} ms ({f.resolution_how})" if f.resolution_s else "none"
        check.add(f"probe {f.name}", "INFO", f"changes every {_num(learned and learned * 1000, '.0f')} ms "
                                             f"(10th percentile of {int(np.sum(np.diff(values) != 0))} changes); "
                                             f"declared {declared}")
    if not found:
        check.add("probe", "FAIL", f"NVML gave no power, energy or utilization in {len(samples)} samples")


def gpu_busy() -> Callable[[float], None]:
    """A load that keeps the GPU busy for the seconds it is given: 4096 x 4096 matrix products."""
    import torch

    a = torch.randn(4096, 4096, device="cuda")

    def busy(seconds: float) -> None:
        nonlocal a
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    return busy


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


def part_tests(check: Check, cuda: bool, tests: Optional[List[str]] = None) -> None:
    """The CUDA tests under pytest (the project's own options: -q, a worker per core up to 4); the row gives pytest's
    summary line ("12 passed, 3 skipped in 40.1s")."""
    if not cuda:
        check.add("tests", "SKIP", "CUDA tests: no CUDA GPU (test_cuda.py skips as a whole)")
        return
    tests = tests or TESTS
    # no second -q: pyproject's addopts has one, and -qq leaves out the summary line
    proc = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", *tests],
               min(300.0, check.left_s() - 200))
    summary = [line.strip("= ") for line in proc.stdout.splitlines()
               if re.search(r"\d+ (passed|failed|skipped|errors?)\b|no tests ran", line)]
    said = summary[-1] if summary else f"no summary line (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
    check.add("tests", "PASS" if proc.returncode == 0 else "FAIL", f"{' '.join(tests)}: {said}")
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
        name = f"predict {s['model']} b{s['batch_size']}"
        check.add(name, *predict_check(p.tensors_bytes + p.non_tensor_bytes, s["mem_peak_bytes"], "allocated"))
        if p.allocator_reserved_bytes is not None and s.get("mem_peak_reserved_bytes"):
            check.add(name, *predict_check(p.peak_bytes, s["mem_peak_reserved_bytes"], "reserved"))


def predict_check(predicted: int, measured: int, which: str, goal: float = 0.10) -> Tuple[str, str]:
    """(status, text) of a predicted peak against the measured one of the same kind: the allocated peak (tensors
    and cuBLAS's workspaces, both through the caching allocator) against max_memory_allocated, or the reserved
    peak (segments + workspaces) against max_memory_reserved."""
    error = (predicted - measured) / measured
    return ("PASS" if abs(error) < goal else "FAIL",
            f"predicted {which} {_mib(predicted)} vs max_memory_{which} {_mib(measured)} ({error:+.1%}; goal within "
            f"{goal:.0%})")


def part_tx2(check: Check, cuda: bool, out: Path) -> None:
    if not cuda:
        check.add("tx2", "SKIP", "target=tx2 capped jobs: no CUDA GPU (on CPU the cap is a peak check)")
        return
    for batch, expect in ((64, "oom"), (2, None)):  # the one the board cannot train, and a control that fits
        folder = out / f"b{batch}"
        cmd = [sys.executable, "-m", "mtbench", *TX2_JOB, f"batch={batch}", "device=cuda", "warmup=1", "steps=1",
               f"hydra.run.dir={folder}", f"lock_dir={out}"]
        proc = run(cmd, min(180.0, check.left_s() - 60))
        try:
            s = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            check.add(f"tx2 b{batch}", "FAIL", f"no summary ({exc}); {proc.stderr[-300:]}")
            continue
        kind = (s.get("failure") or {}).get("kind")
        check.add(f"tx2 b{batch}", "PASS" if kind == expect else "FAIL",
                  f"{' '.join(TX2_JOB)} batch={batch}: {kind or 'fits'} under {_mib(s.get('budget_bytes'))} "
                  f"({s.get('budget_enforced_by')}); must {'be oom' if expect else 'fit'}")


def part_energy(check: Check, cuda: bool, nvml_why: Optional[str], summaries: List[Dict[str, Any]]) -> None:
    if not cuda or nvml_why:
        check.add("energy", "SKIP", f"NVML per-step energy vs the counter: {'no CUDA GPU' if not cuda else nvml_why}")
        return
    for s in summaries:
        if s.get("success"):
            check.add(f"energy {s['model']} b{s['batch_size']}", *energy_check(Path(s["_dir"])))


def energy_check(job_dir: Path, goal: float = 0.05) -> Tuple[str, str]:
    """(status, text): the measured steps' mean power (steps.csv's energies over the steps' time) against the
    energy counter's mean power (samples.csv's first *_energy_mj column) between its last change at or before the
    first step and its first change at or after the last: a window the counter's own updates set, so a wrong
    per-step figure cannot agree with it by construction. INFO where a step has no energy or the counter does not
    change around the steps."""
    with open(job_dir / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["warmup"] in ("False", "false", "0")]
    if not rows or any(not r.get("energy_j_total") for r in rows):
        reasons = sorted({r.get("energy_j_null_reason") or "" for r in rows if not r.get("energy_j_total")} - {""})
        return "INFO", f"{sum(not r.get('energy_j_total') for r in rows)} of {len(rows)} steps without energy: " \
                       f"{'; '.join(reasons)[:200]}"
    with open(job_dir / "samples.csv") as f:
        samples = list(csv.DictReader(f))
    column = next((c for c in (samples[0] if samples else {}) if c.endswith("_energy_mj")), None)
    if column is None:
        return "INFO", "samples.csv has no energy counter column"
    counter = [(float(r["time_s"]), float(r[column])) for r in samples if r.get(column)]
    changes = [counter[0]] + [b for a, b in zip(counter, counter[1:]) if b[1] != a[1]]
    first, last = min(float(r["start_s"]) for r in rows), max(float(r["end_s"]) for r in rows)
    before = [c for c in changes if c[0] <= first]
    after = [c for c in changes if c[0] >= last]
    if not before or not after or after[0][0] <= before[-1][0]:
        return "INFO", f"the counter ({column}) does not change around the measured steps"
    counter_w = (after[0][1] - before[-1][1]) / 1000.0 / (after[0][0] - before[-1][0])
    steps_w = sum(float(r["energy_j_total"]) for r in rows) / sum(float(r["end_s"]) - float(r["start_s"])
                                                                   for r in rows)
    ratio = steps_w / counter_w
    return ("PASS" if abs(ratio - 1) < goal else "FAIL",
            f"steps' mean power {steps_w:.1f} W vs the counter's {counter_w:.1f} W over "
            f"{after[0][0] - before[-1][0]:.2f} s between its own changes: ratio {ratio:.3f} (goal within {goal:.0%})")


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


def guarded(check: Check, part: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args); an exception it raises is the part's FAIL row (its type, text and the line that raised it), and
    the other parts still run: one run on a lent machine must bring back every row it can."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any error of one part is a row, not the end of the run
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        check.add(part, "FAIL", f"{type(exc).__name__}: {str(exc)[:300]} ({Path(where.filename).name}:{where.lineno})")
        return None


def _num(value: Any, fmt: str) -> str:
    return "null" if value is None else format(value, fmt)


def _mib(value: Any) -> str:
    return "null" if value is None else f"{value / 2**20:.0f} MiB"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the jobs' results go (default: a temporary folder)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time, seconds")
    parser.add_argument("--wheels", type=Path, default=REPO / "benchmarks" / "wheels",
                        help="wheels of mtbench's dependencies to install where missing (default benchmarks/wheels)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # asking for a GPU does not start CUDA here
    import torch

    started = time.monotonic()
    out = args.out or Path(tempfile.mkdtemp(prefix="mtbench-gpu-check-"))
    cuda = torch.cuda.is_available()
    check = Check(args.budget_s)
    nvml_why = nvml_reason() if cuda else "no CUDA GPU"
    device = torch.cuda.get_device_name(0) if cuda else "none"
    machine = {"gpu": device, "torch": torch.__version__, "python": sys.version.split()[0],
               "nvml": nvml_why or "answers", "out": str(out)}
    check.add("machine", "INFO", f"GPU {device}; torch {torch.__version__}; NVML {nvml_why or 'answers'}; "
                                 f"results in {out}")
    deps = guarded(check, "deps", part_deps, check, args.wheels)
    guarded(check, "probe", part_probe, check, cuda, nvml_why)
    if deps:
        guarded(check, "tests", part_tests, check, cuda)
        summaries = guarded(check, "matrix", part_matrix, check, cuda, "nvml" if cuda and not nvml_why else "procfs",
                            out / "matrix") or []
        guarded(check, "predict", part_predict, check, cuda, summaries)
        guarded(check, "tx2", part_tx2, check, cuda, out / "tx2")
        guarded(check, "energy", part_energy, check, cuda, nvml_why, summaries)
        guarded(check, "overhead", part_overhead, check, cuda)
    skipped = [r[0] for r in check.rows if r[1] == "SKIP"]
    print(f"\nmtbench gpu_check: {time.monotonic() - started:.0f} s; "
          + (f"skipped: {', '.join(skipped)}" if skipped else "nothing skipped"))
    print(check.table())
    check.as_json(out / "gpu_check.json", machine)
    print(f"every row: {out / 'gpu_check.json'}")
    return 1 if check.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
