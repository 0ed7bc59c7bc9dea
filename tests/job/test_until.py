"""Runs to a target (until.accuracy / until.loss): the stop, summary.json's keys, evals.csv, the checks kept out of
the training's time and energy, the objective, the report's figure and the one-line refusals."""
from __future__ import annotations

import csv
import math
import pickle

import numpy as np
import pytest
import torch

from mtbench.campaign.resume import objective_value
from mtbench.config_overrides import check_overrides
from mtbench.errors import UsageError
from mtbench.report.build import make_report
from mtbench.results.console import print_summary
from mtbench.workload.base import SetupContext, Workload
from tests.conftest import mtbench_cli
from tests.fake_sysfs import make_tx2

VDD_IN_W = 9.0  # the fake TX2's input rail: a constant 9 W, so energy = 9 W x the windows' seconds
# a tiny image classifier: SqueezeNet (no BatchNorm) on 8x8 images; it separates the two classes below in ~10 steps
TINY = ["model=squeezenet", "data=cifar10", "data.image_size=8", "batch=8"]


def write_separable_cifar(root, train=32, test=64, seed=0):
    """A CIFAR-10 python layout (as tests/data/test_sources.py writes it) whose classes 0 and 1 are dark and bright images
    with noise: a network separates them in a few dozen steps, so its held-out accuracy climbs from chance to 1."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)

    def batch(n):
        labels = rng.integers(0, 2, n)
        data = np.where(labels[:, None] == 1, 200, 50) + rng.integers(-40, 40, (n, 3072))
        return {b"labels": [int(v) for v in labels], b"data": np.clip(data, 0, 255).astype(np.uint8)}

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump(batch(test if name == "test_batch" else train), f, protocol=2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, f)
    return root


def test_held_out_split_is_the_test_batch(tmp_path):
    from mtbench.data.cifar10 import CIFAR10, MEAN, STD
    from mtbench.errors import DataError

    write_separable_cifar(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as f:
        test = pickle.load(f, encoding="bytes")
    batches = CIFAR10(root=str(tmp_path)).held_out_image_batches(16, (3, 32, 32), 10)
    assert [len(y) for _, y in batches] == [16] * 4  # all 64 held-out images, none of the training ones
    assert torch.cat([y for _, y in batches]).tolist() == test[b"labels"]
    first = torch.tensor(test[b"data"][0, :1024], dtype=torch.float32).view(32, 32) / 255
    assert torch.allclose(batches[0][0][0, 0], (first - MEAN[0]) / STD[0])  # normalized as the training images
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DataError, match="missing file .*test_batch"):
        CIFAR10(root=str(tmp_path)).held_out_image_batches(16, (3, 32, 32), 10)


def test_accuracy_trains_nothing_and_leaves_the_network_training(tmp_path):
    from mtbench.config import instantiate
    from mtbench.data.cifar10 import CIFAR10
    from tests.conftest import compose_cfg

    write_separable_cifar(tmp_path)
    cfg = compose_cfg(TINY + [f"data.root={tmp_path}"])
    data, w = CIFAR10(root=str(tmp_path), image_size=8), instantiate(cfg.model.workload, "model.workload")
    w.setup(SetupContext(device=torch.device("cpu"), batch_size=8, data=data, seed=0, batches=1))
    held_out = w.held_out_batches(data, 8)
    before = [p.detach().clone() for p in w.net.parameters()]
    first = w.accuracy(held_out)
    assert 0 <= first <= 1 and w.accuracy(held_out) == first  # eval mode: no dropout, the same answer twice
    assert w.net.training and all(torch.equal(a, b) for a, b in zip(before, w.net.parameters()))
    labels = torch.cat([y for _, y in held_out])
    with torch.no_grad():
        w.net.eval()
        predicted = torch.cat([w.net(x).argmax(1) for x, _ in held_out])
    assert first == pytest.approx(float((predicted == labels).float().mean()))


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class FallingLoss(Workload):
    """A workload whose n-th step (from 1) returns the loss 1/n, as a detached 0-d tensor like a real step's."""

    def setup(self, ctx: SetupContext) -> None:
        self.net = torch.nn.Linear(2, 2)
        self.n = 0

    def step(self):
        self.n += 1
        return torch.tensor(1.0 / self.n)

    def modules(self):
        return [self.net]


FALLING = ["model=squeezenet", "~model.workload.net", "~model.workload.optimizer", "~model.workload.input_shape",
           "~model.workload.num_classes", "model.workload._target_=tests.job.test_until.FallingLoss"]


@pytest.fixture(scope="module")
def accuracy_run(tmp_path_factory):
    """One run to 90 % held-out accuracy under a fake TX2 power sensor, shared by the tests that read it."""
    from tests.conftest import compose_cfg
    from mtbench.job.run import run_job

    root = tmp_path_factory.mktemp("until")
    write_separable_cifar(root / "data")
    make_tx2(root / "tx2", {"VDD_IN": VDD_IN_W * 1000, "VDD_SYS_CPU": 1500})
    cfg = compose_cfg(TINY + [f"data.root={root / 'data'}", "sampler=jetson", f"sampler.sysfs_root={root / 'tx2'}",
                              "warmup=1", "steps=40", "until.accuracy=0.9", "until.eval_every=2"])
    return run_job(cfg, root / "job"), root / "job"


def test_stops_at_its_accuracy_target_with_the_keys(accuracy_run):
    s, out = accuracy_run
    assert s["success"], s["failure"]
    assert s["until"] == {"metric": "accuracy", "value": 0.9, "eval_every": 2}
    assert s["target_reached"] is True
    checks = read_csv(out / "evals.csv")
    # it stopped at the first check that met the target, long before its 40 steps ran out
    assert [c["met"] for c in checks] == ["0"] * (len(checks) - 1) + ["1"]
    assert float(checks[-1]["accuracy"]) >= 0.9 > float(checks[0]["accuracy"])
    steps = read_csv(out / "steps.csv")
    assert s["steps_to_target"] == int(checks[-1]["steps"]) == len(steps) < 41  # warm-up step included: it trains
    assert s["measured_steps"] == len(steps) - 1
    assert s["samples_to_target"] == 8 * s["steps_to_target"]
    assert [int(c["steps"]) for c in checks] == list(range(2, s["steps_to_target"] + 1, 2))
    assert s["checks"]["count"] == len(checks) and s["checks"]["best_value"] >= 0.9


def test_checks_count_neither_as_training_time_nor_energy(accuracy_run):
    s, out = accuracy_run
    steps, checks = read_csv(out / "steps.csv"), read_csv(out / "evals.csv")
    train_s = sum(float(r["duration_s"]) for r in steps)
    check_s = sum(float(c["check_time_s"]) for c in checks)
    # time to target: the training steps' windows only; the wall time adds the checks (and the gaps between steps)
    assert s["time_to_target_s"] == pytest.approx(train_s, rel=1e-4)
    assert s["wall_to_target_s"] >= s["time_to_target_s"] + check_s * 0.999
    assert s["checks"]["time_s"] == pytest.approx(check_s, rel=1e-4)
    # energy to target: the steps' energy (warm-up step too), which is 9 W x their time, not 9 W x the wall time
    assert s["energy_to_target_j"] == pytest.approx(sum(float(r["energy_j_total"]) for r in steps), rel=1e-3)
    assert s["energy_to_target_j"] == pytest.approx(VDD_IN_W * s["time_to_target_s"], rel=0.02)
    # each check's energy is its own, beside the training's
    for c in checks:
        assert float(c["check_energy_j"]) == pytest.approx(VDD_IN_W * float(c["check_time_s"]), rel=0.05, abs=0.01)
    assert float(checks[-1]["train_energy_j"]) == pytest.approx(s["energy_to_target_j"], rel=1e-4)
    # and the summary's training figures are those of the measured steps alone, as in any run
    assert s["energy_j"]["total"] == pytest.approx(
        sum(float(r["energy_j_total"]) for r in steps if r["warmup"] == "0"), rel=1e-3)
    assert "energy_to_target_j" not in s["unavailable"]


def test_objectives_and_report_figure(accuracy_run, tmp_path):
    s, out = accuracy_run
    assert objective_value(s, "time_to_target_s") == pytest.approx(s["time_to_target_s"])
    assert objective_value(s, "energy_to_target_j") == pytest.approx(s["energy_to_target_j"])
    report = make_report(out.parent, tmp_path / "report")
    assert (report / "accuracy_squeezenet.png").stat().st_size > 0
    assert "accuracy_squeezenet.png" in (report / "README.md").read_text()


def console_text(summary, capsys) -> str:
    """The job's console summary as one line of words (the table wraps long cells)."""
    capsys.readouterr()
    print_summary(summary, "out")
    return " ".join(capsys.readouterr().out.split())


def test_console_prints_the_time_and_energy_to_target(accuracy_run, capsys):
    s, _ = accuracy_run
    assert (f"to target until.accuracy=0.9 reached: {s['steps_to_target']} steps ({s['samples_to_target']} samples), "
            f"training time {s['time_to_target_s']:.4g} s, wall time with checks {s['wall_to_target_s']:.4g} s, "
            f"energy {s['energy_to_target_j']:.4g} J") in console_text(s, capsys)


def test_loss_target_without_power_sensor(run, tmp_path, capsys):
    # losses 1, 1/2, 1/3, 1/4: the warm-up step, then checks after each step; 1/4 <= 0.3 meets the target
    s = run(FALLING + ["warmup=1", "steps=10", "until.loss=0.3", "until.eval_every=1", "sampler=procfs"])
    assert s["success"], s["failure"]
    assert s["target_reached"] and s["steps_to_target"] == 4 and s["measured_steps"] == 3
    assert s["time_to_target_s"] > 0
    assert s["energy_to_target_j"] is None and "power sensor" in s["unavailable"]["energy_to_target_j"]
    assert objective_value(s, "energy_to_target_j") == math.inf
    checks = read_csv(tmp_path / "job" / "evals.csv")
    assert [float(c["loss"]) for c in checks] == pytest.approx([1 / 2, 1 / 3, 1 / 4], rel=1e-5)
    # no power sensor: the console says why there is no energy to target, never 0 J
    assert (f"to target until.loss=0.3 reached: 4 steps (64 samples), training time {s['time_to_target_s']:.4g} s, "
            f"wall time with checks {s['wall_to_target_s']:.4g} s, energy n/a (no power sensor sampled the job's "
            f"total (sampler.sensors has no power rail here))") in console_text(s, capsys)


def test_loss_checked_on_the_mean_since_the_last_check(run, tmp_path, capsys):
    s = run(FALLING + ["warmup=0", "steps=5", "until.loss=0.01", "until.eval_every=2", "sampler=procfs"])
    assert s["success"], s["failure"]
    assert s["target_reached"] is False and s["measured_steps"] == 5  # `steps` ran out
    for key in ("steps_to_target", "samples_to_target", "time_to_target_s", "wall_to_target_s", "energy_to_target_j"):
        assert s[key] is None and "not met in 5 steps" in s["unavailable"][key]
    assert objective_value(s, "time_to_target_s") == math.inf
    assert f"to target until.loss=0.01 NOT reached: {s['unavailable']['steps_to_target']}" in console_text(s, capsys)
    # checks after steps 2 and 4 (the mean of the two steps since the last check) and after the last step
    checks = read_csv(tmp_path / "job" / "evals.csv")
    assert [float(c["loss"]) for c in checks] == pytest.approx([(1 + 1 / 2) / 2, (1 / 3 + 1 / 4) / 2, 1 / 5],
                                                               rel=1e-5)


def test_ordinary_run_has_no_target_keys(run, tmp_path):
    s = run(FALLING)
    assert "target_reached" not in s and not (tmp_path / "job" / "evals.csv").exists()


@pytest.mark.parametrize("overrides, says", [
    (["until.accuracy=0.5", "until.loss=1"], "until.accuracy=0.5 and until.loss=1 are both set"),
    (["until.accuracy=0.5", "profile=true"], "profile=false"),
    (["until.accuracy=0.5"], "model=squeezenet measures no accuracy"),  # FallingLoss is no classifier
])
def test_bad_targets_are_one_line(run, overrides, says):
    with pytest.raises(UsageError, match=says):
        run(FALLING + overrides)


@pytest.mark.slow
def test_accuracy_on_synthetic_data_is_one_line_exit_2(tmp_path):
    proc = mtbench_cli("model=squeezenet", "batch=2", "device=cpu", "steps=1", "warmup=0", "until.accuracy=0.5",
                       f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtbench: error: until.accuracy: data=synthetic"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["90", "0", "-0.5", "nan", "true"])
def test_accuracy_out_of_range_is_refused_before_any_job(value):
    # what the command line checks before Hydra starts: one line (mtbench: error: ...), exit 2
    with pytest.raises(UsageError, match=r"^until.accuracy=.* is not allowed; allowed: null or a held-out top-1 "
                                         r"accuracy 0 < A <= 1 \(0.94 for 94 %\)$"):
        check_overrides([f"until.accuracy={value}"])


@pytest.mark.parametrize("override", ["until.loss=0", "until.loss=inf", "until.eval_every=0"])
def test_loss_and_eval_every_out_of_range_are_refused(override):
    with pytest.raises(UsageError, match=f"^{override.split('=')[0]}="):
        check_overrides([override])


@pytest.mark.parametrize("keys, says", [
    ({"objective": "time_to_target_s"}, "objective=time_to_target_s needs a run to a target; allowed: until.accuracy"),
    ({"objective": "energy_to_target_j", "until": {"loss": 1.0}},
     "objective=energy_to_target_j needs a power sensor and sampler=procfs has none"),
    ({"objective": "time_to_target_s", "until": {"accuracy": 0.9}}, None),
])
def test_sweep_for_the_least_to_target_is_checked_before_any_job(keys, says):
    from omegaconf import OmegaConf

    from mtbench.campaign.sweep import sweep_problem

    cfg = OmegaConf.create({"hydra": {"launcher": {}}, "sampler": {"sensors": ["procfs"]},
                            "until": {"accuracy": None, "loss": None}})
    cfg = OmegaConf.merge(cfg, keys)
    problem = sweep_problem(cfg)
    assert problem == says if says is None else problem.startswith(says), problem
