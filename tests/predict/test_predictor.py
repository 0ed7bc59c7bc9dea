"""The predictor on tiny workloads: breakdown sums, linear activations, Linear-layer FLOPs, allocator, CLI."""
from __future__ import annotations

import json
from typing import List

import pytest
import torch

# the predictor needs torch >= 2.5 (MemTracker; mtbench.predict.MIN_TORCH): on an older torch the module skips
pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.data.synthetic import Synthetic  # noqa: E402
from mtbench.predict import allocator, calibration  # noqa: E402
from mtbench.predict.trace import BREAKDOWN_KEYS, trace_step  # noqa: E402
from mtbench.workload.base import SetupContext, Workload  # noqa: E402


class TinyMLP(Workload):
    """Linear(inp, hidden) -> ReLU -> Linear(hidden, out), plain SGD; optionally inputs that need a gradient."""

    def __init__(self, inp: int = 8, hidden: int = 256, out: int = 4, layers: int = 2, input_grad: bool = False,
                 bias: bool = True) -> None:
        self.inp, self.hidden, self.out, self.layers = inp, hidden, out, layers
        self.input_grad = input_grad
        if layers == 1:
            self.net = torch.nn.Linear(inp, out, bias=bias)
        else:
            self.net = torch.nn.Sequential(torch.nn.Linear(inp, hidden, bias=bias), torch.nn.ReLU(),
                                           torch.nn.Linear(hidden, out, bias=bias))

    def setup(self, ctx: SetupContext) -> None:
        self.net.to(ctx.device).train()
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.x = torch.randn(ctx.batch_size, self.inp, device=ctx.device, requires_grad=self.input_grad)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.net(self.x).square().mean().backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


def _ctx(batch: int) -> SetupContext:
    return SetupContext(device=torch.device("cpu"), batch_size=batch, data=Synthetic(), seed=0, batches=1)


def _trace(batch: int, **kw):
    return trace_step(lambda: TinyMLP(**kw), _ctx(batch))


def test_breakdown_sums_to_the_peak():
    t = _trace(16)
    assert set(t.breakdown_bytes) == set(BREAKDOWN_KEYS)
    assert sum(t.breakdown_bytes.values()) == t.peak_tensor_bytes > 0
    # nothing was allocated: the parameters are fake, yet their bytes are counted exactly
    params = (8 * 256 + 256 + 256 * 4 + 4) * 4
    assert t.breakdown_bytes["parameters"] == params
    assert t.fake


def test_activations_grow_linearly_with_the_batch():
    acts = {b: _trace(b).breakdown_bytes["activations"] for b in (64, 128, 256)}
    assert acts[64] > 0
    assert acts[256] - acts[128] == 2 * (acts[128] - acts[64])


def test_flops_of_one_linear_layer():
    b, inp, out = 32, 24, 10
    t = _trace(b, inp=inp, out=out, layers=1, input_grad=True, bias=False)
    assert t.forward_flops == 2 * b * inp * out
    # backward: the gradient of the input and of the weight, each as large as the forward
    assert t.flops - t.forward_flops == 2 * (2 * b * inp * out)


def test_cuda_rounding_and_segments():
    assert allocator.round_request(1) == 512
    assert allocator.round_request(513) == 1024
    assert allocator.segment_size(4096) == 2 << 20
    assert allocator.segment_size(3 << 20) == 20 << 20
    assert allocator.segment_size(11 << 20) == 12 << 20
    peaks = allocator.replay([(1, 3 << 20, "Activation"), (2, 100, "Parameter"), (1, -1, "Activation"),
                              (3, 2 << 20, "Activation")])
    assert peaks.allocated_bytes == (3 << 20) + 512
    assert peaks.reserved_bytes == (20 << 20) + (2 << 20)  # the 2 MiB block reuses the freed 20 MiB segment


def test_prediction_for_a_board_sums_and_fits(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from mtbench.predict.predictor import Predictor

    predictor = Predictor(target_name="nano", overrides=("model.workload.ngf=8", "model.workload.ndf=8"))
    p = predictor.predict("dcgan", 4)
    assert p.device == "cuda" and p.budget_bytes == predictor.target.memory_budget_bytes
    assert sum(p.breakdown_bytes.values()) == p.tensors_bytes
    assert p.tensors_bytes % 512 == 0 and p.allocator_reserved_bytes >= p.tensors_bytes
    assert p.peak_bytes == p.allocator_reserved_bytes + p.non_tensor_bytes
    assert not p.calibrated and p.step_time_s == p.roofline_s > 0  # uncalibrated: the roofline


def test_fit_recovers_a_nonnegative_model():
    rng = __import__("numpy").random.default_rng(0)
    x = [calibration.time_features(f, b, n, None, None) for f, b, n in
         zip(rng.uniform(1e9, 1e11, 20), rng.uniform(1e8, 1e10, 20), rng.integers(100, 5000, 20))]
    coef = [0.01, 2e-11, 0.0, 1e-5]
    y = [float(v @ coef) for v in x]
    fitted = calibration.fit_nonnegative(__import__("numpy").array(x), __import__("numpy").array(y))
    assert (fitted >= 0).all()
    assert calibration.mape_pct([float(v @ fitted) for v in x], y) < 1e-6


def _summary(folder, model, batch, step_s, peak, before):
    d = folder / f"{model}-b{batch}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "model": model, "batch_size": batch, "device": "cpu", "success": True, "step_time_s": {"median": step_s},
        "mem_peak_bytes": peak, "mem_peak_source": "process_rss", "mem_runtime_bytes": before,
        "target": "none", "env": {"device_name": "test cpu"}}))


def test_calibrate_then_predict_uses_it(tmp_path, monkeypatch, capsys):
    from mtbench.commands.predict import main_calibrate, main_predict
    from mtbench.predict.predictor import Predictor

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path / "cal"))
    sweep = tmp_path / "sweep"
    for batch, step_s in ((2, 0.02), (4, 0.03), (8, 0.05)):
        _summary(sweep, "char_rnn", batch, step_s, peak=(500 << 20) + batch * (1 << 20), before=400 << 20)
    overrides = ["model.workload.seq_len=8", "model.workload.hidden=16"]
    assert main_calibrate([str(sweep), *overrides]) == 0
    cal = calibration.load("none-cpu")
    assert cal is not None and cal.runs == 3 and cal.non_tensor_bytes is not None and cal.time_coef is not None
    assert main_predict(["model=char_rnn", "batch=4", "device=cpu", f"out={tmp_path / 'p'}", *overrides]) == 0
    rows = json.loads((tmp_path / "p" / "predict.json").read_text())
    here = Predictor(target_name="none", device="cpu", overrides=overrides)
    held, _ = here.held_outside(here.trace("char_rnn", 4)[0])  # MKL's kept buffers: counted, not fitted
    assert rows[0]["calibrated"] and rows[0]["non_tensor_bytes"] == cal.non_tensor_bytes + held
    assert abs(rows[0]["step_time_s"] - 0.03) / 0.03 < 0.5
    assert (tmp_path / "p" / "predict.csv").read_text().startswith("model,batch_size")


@pytest.mark.parametrize("argv, says", [
    (["model=nope", "batch=2"], "model='nope' is not known"),
    (["model=alexnet", "batch=1,2"], "needs -m"),
    (["model=alexnet", "batch=0"], "batch=0 is out of range"),
    (["model=alexnet", "batch=2", "target=moon"], "target='moon' is not known"),
    (["model=alexnet"], "model= and batch= are required"),
    (["model=alexnet", "batch=2", "calibration=/nonexistent.json"], "is not a file"),
    # issue 51 item 10: an output it cannot write was a traceback after every trace
    (["model=alexnet", "batch=2", "out=/proc/mtbench-predict"], "out='/proc/mtbench-predict' is not a folder this "
                                                                 "user can write"),
    (["model=alexnet", "batch=2", f"out={__file__}"], "is not a folder this user can write (File exists)"),
])
def test_bad_input_is_one_line(argv, says, capsys):
    from mtbench.commands.predict import main_predict

    assert main_predict(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtbench: error:") and says in err and "\n" not in err


def test_old_torch_ends_in_one_line(monkeypatch, capsys):
    from mtbench.commands.predict import main_calibrate

    monkeypatch.setattr(torch, "__version__", "2.1.0")
    assert main_calibrate(["somewhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs torch >= 2.5" in err and "\n" not in err


# the CUDA prediction against max_memory_allocated is in tests/device/test_cuda.py, in a fresh process


@pytest.mark.slow
def test_max_batch_is_the_largest_that_fits(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from mtbench.predict.predictor import Predictor

    tiny = ("model.workload.ngf=4", "model.workload.ndf=4")
    probe = Predictor(target_name="nano", overrides=tiny)
    at_8 = probe.predict("dcgan", 8).peak_bytes
    budget = at_8 + (at_8 - probe.predict("dcgan", 4).peak_bytes) * 3  # room for about 20 samples
    predictor = Predictor(target_name="nano", overrides=tiny + (f"target.memory_budget_bytes={budget}",))
    best, note = predictor.max_batch("dcgan", 8)
    assert 8 < best < 100
    assert predictor.predict("dcgan", best).fits and not predictor.predict("dcgan", best + 1).fits, note


@pytest.mark.parametrize("major, minor, config, mib", [
    (9, 0, None, 32.0),                 # Hopper: 4096 KiB x 8
    (8, 7, None, 8.125),                # Orin (sm87) and every other GPU: 4096 KiB x 2 + 16 KiB x 8
    (None, None, None, 8.125),          # no GPU visible: the non-Hopper default
    (9, 0, ":4096:8:16:8", 32.125),     # CUBLAS_WORKSPACE_CONFIG's pairs win
    (8, 0, ":16:8", 0.125),
])
def test_the_cuda_term_is_cublas_workspace_not_zero(major, minor, config, mib):
    """Issue 27 item 8: the cuBLAS workspace goes through the caching allocator (it counts in max_memory_allocated
    and against the fraction cap): an uncalibrated CUDA prediction includes it instead of 0."""
    from mtbench.predict.non_tensor import cublas_workspace_bytes

    assert cublas_workspace_bytes(major, minor, config) == int(mib * 2**20)


def test_an_uncalibrated_cuda_prediction_counts_the_cublas_workspace(monkeypatch):
    from mtbench.predict import predictor as mod

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    size, note = mod.cuda_non_tensor_bytes()
    assert size >= 16 * 2**20 and "cuBLAS's workspaces" in note and "cuDNN" in note


def test_a_training_step_counts_two_cublas_workspaces_of_the_targets_gpu(monkeypatch):
    """torch gives each thread its own cuBLAS handle and workspace: the forward pass's and autograd's backward
    thread's. Sized for the target's GPU (an Orin, sm87: 4 MiB x 2 + 16 KiB x 8 each), not the host's (an H100
    here, sm90: 32 MiB each)."""
    from mtbench.device.targets import load_target
    from mtbench.predict import predictor as mod

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert load_target("agx_orin").capability() == (8, 7)
    size, note = mod.cuda_non_tensor_bytes(load_target("agx_orin").capability())
    assert size == 2 * (4096 * 2 + 16 * 8) * 1024
    assert "the forward thread's and autograd's backward thread's; the target's GPU, sm87" in note
    size, note = mod.cuda_non_tensor_bytes(None)  # no target: this machine's GPU
    assert size == 2 * 32 * 2**20 and "this machine's GPU, sm90" in note


def test_calibrate_profile_switch_reaches_the_fit(tmp_path, monkeypatch, capsys):
    from mtbench.commands.predict import main_calibrate
    from mtbench.predict import fit

    got = {}

    def fake_calibrate(folder, **kwargs):
        got.update(kwargs, folder=folder)
        return calibration.Calibration("none-cpu", "none", "cpu", "test cpu", str(folder), 1, "now"), tmp_path / "cal.json", []

    monkeypatch.setattr(fit, "calibrate", fake_calibrate)
    assert main_calibrate([str(tmp_path), "profile=true", "model.workload.hidden=16"]) == 0
    assert got["profile"] is True and got["overrides"] == ("model.workload.hidden=16",)
    assert main_calibrate([str(tmp_path)]) == 0 and got["profile"] is False
    assert main_calibrate([str(tmp_path), "profile=maybe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mtbench: error: profile='maybe' is not known; allowed: true, false"]


def test_a_replay_buffer_is_predicted_on_a_cpu_not_on_a_gpu(tmp_path, monkeypatch):
    """DQN's replay buffer is NumPy memory the trace's tensors never see (the prediction was 55 % low): on a CPU its
    touched pages (setup's random play plus the job's steps, 4 environment steps each) count beside the tensors."""
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from mtbench.predict.predictor import DEFAULT_NON_TENSOR_BYTES_CPU_LIVE as DEFAULT_NON_TENSOR_BYTES_CPU, Predictor

    small = ("model.workload.learning_starts=40", "model.workload.buffer_size=100", "warmup=1",
             "steps=3")
    predictor = Predictor(target_name="none", device="cpu", overrides=small)
    p = predictor.predict("dqn", 8)
    from models.dqn import _EMULATOR_BYTES

    mkl = _mkl_kept(predictor, "dqn", 8) + _EMULATOR_BYTES.get("atari:Pong", 0)  # ALE's, where the trace made it
    transition = 2 * 4 * 84 * 84 + 8 + 4 + 4  # observation and next observation (uint8), action, reward, done
    assert p.non_tensor_bytes - DEFAULT_NON_TENSOR_BYTES_CPU - mkl == (40 + 4 * 4) * transition, p.non_tensor_note
    assert "replay buffer" in p.non_tensor_note
    full = Predictor(target_name="none", device="cpu", overrides=(*small[:-1], "steps=100")).predict("dqn", 8)
    assert full.non_tensor_bytes - DEFAULT_NON_TENSOR_BYTES_CPU - mkl == 100 * transition  # no more than its capacity


def _mkl_kept(predictor, model: str, batch: int) -> int:
    """What a prediction counts of MKL's kept buffers (tests/predict/test_mkl_buffers.py; 0 without MKL)."""
    return predictor.mkl_kept(predictor.trace(model, batch)[0])[0] or 0


def test_a_calibration_leaves_a_replay_buffer_out_of_the_runtime_it_fits(tmp_path, monkeypatch):
    """A prediction counts DQN's replay buffer from its touched pages (Workload.host_bytes) beside the fitted runtime:
    the fit takes it out of the measured memory first, or a calibration on DQN would count it twice."""
    import numpy as np

    from mtbench.predict import fit
    from mtbench.predict.predictor import Predictor

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path / "cal"))
    small = ("model.workload.learning_starts=40", "model.workload.buffer_size=100", "warmup=1", "steps=3")
    for batch in (2, 4, 8):
        _summary(tmp_path / "sweep", "dqn", batch, 0.01 * batch, peak=600 << 20, before=400 << 20)
    cal, _, _ = fit.calibrate(tmp_path / "sweep", overrides=small)
    p = Predictor(target_name="none", device="cpu", overrides=small, stored_calibration=False)
    outside = [(200 << 20) - p.predict("dqn", b).tensors_bytes - p.trace("dqn", b)[0].host_bytes
               - _mkl_kept(p, "dqn", b) for b in (2, 4, 8)]
    assert p.trace("dqn", 8)[0].host_bytes > 0 and cal.non_tensor_bytes == int(np.median(outside))


@pytest.mark.slow
def test_training_memory_is_predicted_under_the_malloc_it_is_measured_under(tmp_path, monkeypatch):
    """A CPU job's training memory is measured with glibc's mmap threshold fixed (memory.cpu_malloc=auto: every step
    under a budget, two untimed steps without one), which keeps far less memory that is not tensors (15-58 MiB at
    four models' max batch) than glibc's own settings (240-390): memory.cpu_malloc=glibc alone predicts the latter."""
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from mtbench.predict import predictor as mod

    tiny = ("model.workload.ngf=4", "model.workload.ndf=4")
    for target, extra in [("nano", ()), ("none", ()), ("none", ("memory.budget_gb=1",)),
                          ("none", ("memory.cpu_malloc=live",))]:
        predictor = mod.Predictor(target_name=target, device="cpu", overrides=(*tiny, *extra))
        assert predictor.predict("dcgan", 2).non_tensor_bytes == mod.DEFAULT_NON_TENSOR_BYTES_CPU_LIVE, (target, extra)
    for target in ("nano", "none"):
        glibc = mod.Predictor(target_name=target, device="cpu", overrides=(*tiny, "memory.cpu_malloc=glibc"))
        assert glibc.predict("dcgan", 2).non_tensor_bytes == mod.DEFAULT_NON_TENSOR_BYTES_CPU, target


@pytest.mark.parametrize("peak_of, best", [
    (lambda b: 100 * 2**20 + b * 2**20 + (2**22 if b > 8 else 0), 1020),  # linear, a step above batch 8
    (lambda b: 100 * 2**20 + b * b * 2**14, 256),  # curved: the line through the ends must not creep (Illinois)
])
def test_the_max_batch_search_interpolates_in_few_traces(monkeypatch, tmp_path, peak_of, best):
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from types import SimpleNamespace

    from mtbench.predict import predictor as mod

    budget = 1124 * 2**20
    predictor = mod.Predictor(target_name="nano", device="cpu", overrides=(f"target.memory_budget_bytes={budget}",))
    traced = []

    def predict(model, batch, timed=True):
        if batch not in traced:
            traced.append(batch)
        peak = peak_of(batch)
        return SimpleNamespace(peak_bytes=peak, fits=peak <= budget, breakdown_bytes={"parameters": 100 * 2**20},
                               non_tensor_bytes=0)

    monkeypatch.setattr(predictor, "predict", predict)
    found, _ = predictor.max_batch("any", 2)
    assert abs(found - best) <= max(1, best // 100) and peak_of(found) <= budget, (found, traced)
    # the anchor, the guess from its breakdown (100 MiB fixed, the rest per sample), then the line or Illinois
    assert len(traced) <= (4 if best == 1020 else 15), traced


@pytest.mark.parametrize("out, says", [("/proc/mtbench-cal.json", "out='/proc' is not a folder this user can write"),
                                       ("/tmp", "out='/tmp' is a folder")])
def test_calibrate_refuses_an_output_it_cannot_write_before_the_fit(out, says, tmp_path, capsys):
    from mtbench.commands.predict import main_calibrate

    assert main_calibrate([str(tmp_path), f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtbench: error:") and says in err and "\n" not in err


def test_calibrate_names_an_unknown_target_and_what_is_allowed(tmp_path, capsys):
    """Issue 51 item 10: `calibrate DIR target=nosuch` printed Hydra's text."""
    from mtbench.commands.predict import main_calibrate

    assert main_calibrate([str(tmp_path), "target=nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtbench: error: target='nosuch' is not known; allowed: ") and "tx2" in err
    assert "\n" not in err



def test_an_emulators_time_is_added_on_this_host_and_left_out_for_a_board(tmp_path, monkeypatch):
    """DQN's step is four emulator steps (no op of torch's) and an update: the trace times the emulator's part
    (Workload.host_seconds) and the prediction adds it to the ops' time on this host; for a board it is said, not
    added (the board's CPU runs the emulator at another speed)."""
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from mtbench.predict.predictor import Predictor

    monkeypatch.setattr(Predictor, "_time", lambda self, trace: (1.0, None, "the ops' time"))
    small = ("model.workload.learning_starts=40", "model.workload.buffer_size=100")
    here = Predictor(target_name="none", device="cpu", overrides=small)
    trace, _ = here.trace("dqn", 8)
    assert 0 < trace.host_s < 1.0, trace.host_s  # four steps of the emulator, timed in the trace's last step
    p = here.predict("dqn", 8)
    assert p.step_time_s == pytest.approx(1.0 + trace.host_s) and "outside torch's ops" in p.time_note
    board = Predictor(target_name="nano", device="cpu", overrides=small).predict("dqn", 8)
    assert board.step_time_s == 1.0 and "not counted" in board.time_note, board.time_note
    tiny = ("model.workload.ngf=4", "model.workload.ndf=4")
    assert Predictor(target_name="none", device="cpu", overrides=tiny).predict("dcgan", 2).step_time_s == 1.0
