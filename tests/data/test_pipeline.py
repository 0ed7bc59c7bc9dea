"""data.loader=dataloader: a DataLoader over CIFAR-10's files, each step's data wait, its workers ended with the job."""
from __future__ import annotations

import importlib.util
import csv
import os
import time
from pathlib import Path

import pytest
import torch

from mtbench.data.base import LoaderSettings
from mtbench.data.cifar10 import MEAN, STD
from mtbench.data.ondisk import synthetic_cifar_root
from mtbench.data.pipeline import Pipeline, cifar_train_transform
from mtbench.errors import DataError, UsageError
from tests.conftest import mtbench_cli
from tests.data.test_sources import write_cifar


def _children() -> set:
    """The pids of this process's children (every thread's), from procfs."""
    pids = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            pass
    return pids


def _settings(**keys) -> LoaderSettings:
    return LoaderSettings.from_keys({"loader": "dataloader", **keys})


@pytest.mark.parametrize("workers", [0, 1])
def test_a_job_on_the_pipeline_trains_and_records_each_steps_data_wait(run, tmp_path, workers):
    summary = run(["model=squeezenet", "batch=2", "warmup=1", "steps=2", "data.loader=dataloader",
                   f"data.workers={workers}", f"data.cache_dir={tmp_path / 'cache'}"])
    assert summary["success"], summary["failure"]
    assert summary["data_pipeline"]["workers"] == workers
    # torchvision >= 0.15 has transforms.v2; an older one (JetPack 4's 0.14) the classic transforms, as said
    v2 = importlib.util.find_spec("torchvision.transforms.v2") is not None
    assert summary["data_pipeline"]["transforms"] == ("torchvision.transforms.v2" if v2 else "torchvision.transforms")
    assert summary["data_wait_s"]["median"] > 0
    assert 0 < summary["data_wait_share"] < 1
    with open(tmp_path / "job" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(float(r["data_wait_s"]) > 0 for r in rows)
    # the step's own time is the same measure as before: the wait lies outside its window
    for r, nxt in zip(rows, rows[1:]):
        assert float(nxt["start_s"]) - float(r["end_s"]) >= float(nxt["data_wait_s"]) * 0.99
    # the synthetic set was written once, in the real format, where data.cache_dir says
    (written,) = (tmp_path / "cache").glob("*/cifar-10-batches-py/complete")
    assert summary["data_pipeline"]["root"] == str(written.parent.parent)


def test_preloaded_stays_the_default_and_its_data_wait_is_null_with_a_reason(run, tmp_path):
    summary = run(["model=squeezenet", "batch=2"])
    assert summary["data_pipeline"] == {"loader": "preloaded"}
    assert summary["data_wait_s"] is None and summary["data_wait_share"] is None
    assert "before timing" in summary["unavailable"]["data_wait_s"]
    with open(tmp_path / "job" / "steps.csv") as f:
        assert "data_wait_s" not in next(csv.reader(f))


def test_the_job_ends_its_loader_workers(run, tmp_path):
    before = _children()
    summary = run(["model=squeezenet", "batch=2", "steps=2", "data.loader=dataloader", "data.workers=2",
                   "data.persistent_workers=true", f"data.cache_dir={tmp_path / 'cache'}"])
    assert summary["success"], summary["failure"]
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children() - before, "loader workers outlived the job"


def test_close_ends_persistent_workers(tmp_path):
    write_cifar(tmp_path, per_batch=4)
    pipeline = Pipeline(str(tmp_path), _settings(workers=2, persistent_workers=True), 2, seed=0)
    before = _children()
    pipeline.next_batch()
    assert len(_children() - before) == 2  # the two workers run
    pipeline.close()
    assert not _children() - before


def test_epochs_reread_the_files_and_a_file_corrupted_since_is_one_line(tmp_path):
    folder = write_cifar(tmp_path, per_batch=1)  # 5 images: two batches of 2 per epoch (the last one dropped)
    pipeline = Pipeline(str(tmp_path), _settings(), 2, seed=0)
    for _ in range(2):
        (x, y), wait_s = pipeline.next_batch()
        assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (2,) and wait_s > 0
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_3: not a CIFAR-10 python pickle") as err:
        pipeline.next_batch()  # the third batch starts the second epoch, which reads the files again
    assert "\n" not in str(err.value)


def test_a_missing_file_is_the_loaders_one_line(tmp_path):
    folder = write_cifar(tmp_path)
    (folder / "data_batch_5").unlink()
    with pytest.raises(DataError, match="missing file .*data_batch_5"):
        Pipeline(str(tmp_path), _settings(), 2, seed=0).next_batch()


@pytest.mark.slow
def test_a_missing_root_on_the_command_line_is_one_line_exit_2(tmp_path):
    proc = mtbench_cli("model=squeezenet", "device=cpu", "batch=2", "steps=1", "warmup=0", "data=cifar10",
                       f"data.root={tmp_path}", "data.loader=dataloader", f"hydra.run.dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtbench: error: data.root: missing file"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_augmentations_are_random_per_epoch_and_normalize_with_cifars_statistics():
    transform, module = cifar_train_transform()
    v2 = importlib.util.find_spec("torchvision.transforms.v2") is not None  # torchvision < 0.15: the classic ones
    assert module == ("torchvision.transforms.v2" if v2 else "torchvision.transforms")
    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    views = [transform(image) for _ in range(4)]
    assert any(not torch.equal(views[0], v) for v in views[1:])  # crops and flips differ from draw to draw
    flat = torch.full((3, 32, 32), 128, dtype=torch.uint8)
    centre = transform(flat)[:, 16, 16]  # padding only reaches the border: the centre is the image's own pixel
    expected = (128 / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert torch.allclose(centre, expected, atol=1e-5)


def test_the_synthetic_set_is_written_once_and_a_half_written_one_again(tmp_path):
    root = Path(synthetic_cifar_root(str(tmp_path), per_file=3))
    folder = root / "cifar-10-batches-py"
    stamp = (folder / "data_batch_1").stat().st_mtime_ns
    assert synthetic_cifar_root(str(tmp_path), per_file=3) == str(root)
    assert (folder / "data_batch_1").stat().st_mtime_ns == stamp  # not written again
    (folder / "complete").unlink()  # a job killed while writing
    (folder / "data_batch_2").write_bytes(b"half")
    synthetic_cifar_root(str(tmp_path), per_file=3)
    pipeline = Pipeline(str(root), _settings(), 2, seed=0)
    (x, _), _ = pipeline.next_batch()
    assert x.shape == (2, 3, 32, 32)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


def test_a_link_planted_as_the_cache_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "cifar10-synthetic-3-s0")
    with pytest.raises(DataError, match="data.cache_dir=.*not a folder"):
        synthetic_cifar_root(str(tmp_path), per_file=3)


@pytest.mark.parametrize("key,value,allowed", [("loader", "fast", "preloaded, dataloader"),
                                               ("workers", -1, "a whole number >= 0"),
                                               ("prefetch_factor", 0, "a whole number >= 1"),
                                               ("pin_memory", "yes", "true, false")])
def test_a_bad_loader_setting_names_the_value_and_what_is_allowed(key, value, allowed):
    with pytest.raises(UsageError, match=f"data.{key}=.*allowed: {allowed}"):
        _settings(**{key: value})


class SlowSet(torch.utils.data.Dataset):
    """Each item takes `item_s` seconds to load, as a slow disk or a heavy decode would."""

    def __init__(self, item_s: float, size: int = 64) -> None:
        self.item_s, self.size = item_s, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.item_s)
        return torch.zeros(3, 32, 32), torch.tensor(0)


def _waits(workers: int, step_s: float, batches: int = 6) -> list:
    pipeline = Pipeline("", _settings(workers=workers, prefetch_factor=2), 2, seed=0, dataset=lambda: SlowSet(0.02))
    try:
        waits = []
        for _ in range(batches):
            _, wait_s = pipeline.next_batch()
            waits.append(wait_s)
            time.sleep(step_s)  # the training step, during which workers load ahead
        return waits[2:]  # after the workers' start-up
    finally:
        pipeline.close()


def test_data_wait_is_what_the_workers_cannot_hide():
    """Lower bounds are the sleeps' own (a loaded machine only lengthens them); the workers' gain is a ratio to the
    loop's own wait measured in the same test, not a wall time a neighbour can change."""
    # no workers: the loop loads each batch itself, 2 items x 20 ms
    alone = _waits(0, 0.0)
    assert min(alone) >= 0.04 * 0.98, alone
    # one worker, 40 ms a batch, under a 20 ms step: it hides about half, the loop still waits for the rest
    one = sorted(_waits(1, 0.02))
    assert 0.01 <= one[1] < sorted(alone)[1], (one, alone)
    # two workers under a 60 ms step keep ahead: the wait is the hand-over only, a fraction of a batch's loading
    two = _waits(2, 0.06)
    assert max(two) < min(alone) / 2, (two, alone)


def test_a_killed_worker_is_an_error_not_a_hang(tmp_path):
    write_cifar(tmp_path, per_batch=4)
    pipeline = Pipeline(str(tmp_path), _settings(workers=1, persistent_workers=True), 2, seed=0)
    before = _children()
    try:
        pipeline.next_batch()
        (worker,) = _children() - before
        # torch's SIGCHLD handler may raise as soon as the worker dies: the kill is inside the block
        with pytest.raises(RuntimeError, match="DataLoader worker"):
            os.kill(worker, 9)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the batches it made before it died may come first
                pipeline.next_batch()
                time.sleep(0.05)
    finally:
        pipeline.close()


def test_a_model_without_a_pipeline_is_one_line_before_any_step(run, tmp_path):
    with pytest.raises(UsageError) as err:  # DQN's Atari environment has no files to load
        run(["model=dqn", "data=synthetic", "batch=2", "data.loader=dataloader", f"data.cache_dir={tmp_path / 'cache'}"])
    assert "\n" not in str(err.value)
    assert "this model trains only on the batches it prepares" in str(err.value)
    assert str(err.value).endswith("allowed: data.loader=preloaded")
    assert not (tmp_path / "job" / "summary.json").exists() and not (tmp_path / "cache").exists()
