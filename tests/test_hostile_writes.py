"""Another user of a shared board plants files and links where root's mtbench reads and writes (issue 46, items 1
and 5): a power restore record root would apply, links where root writes its results. Planted as user nobody;
each victim is a root-only file whose bytes must not change."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_cfg, mtbench_cli
from tests.helpers.hostile import as_nobody, need_root, shared_folder
from tests.helpers.run_if import run_if

pytestmark = run_if(root=True, why="to plant files as another user (setuid to nobody)")


def victim_file(tmp_path: Path) -> Path:
    folder = tmp_path / "root-only"
    folder.mkdir()
    os.chmod(folder, 0o700)
    victim = folder / "victim"
    victim.write_bytes(b"root's own bytes\n")
    os.chmod(victim, 0o600)
    return victim


def bytes_and_mode(path: Path) -> tuple:
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


def planted_record(folder: str, victim: Path) -> None:
    """As nobody: `folder` (0777) holding a power restore record that writes 'PWNED' into `victim`."""
    def plant() -> None:
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o777)
        with open(os.path.join(folder, "power_restore.json"), "w") as f:
            json.dump({"root": "/", "files": [[str(victim).lstrip("/"), "PWNED"]]}, f)

    as_nobody(plant)


# 1. a planted power_restore.json

def test_a_job_folder_another_user_made_is_refused_and_its_record_never_applied(tmp_path):
    need_root()
    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    run_dir = os.path.join(shared_folder(), "run1")
    planted_record(run_dir, victim)
    proc = mtbench_cli("model=squeezenet", "batch=1", "steps=1", "warmup=0", "device=cpu", f"hydra.run.dir={run_dir}",
                       timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "belongs to uid 65534" in lines[0], lines
    assert bytes_and_mode(victim) == before


def test_a_default_folder_under_a_parent_another_user_made_is_refused(tmp_path):
    """`outputs/<today>/` made by nobody in a shared working folder: root's job folder made inside it could be
    swapped for nobody's own while the job runs."""
    need_root()
    cwd = shared_folder()
    as_nobody(lambda: (os.makedirs(os.path.join(cwd, "outputs", "day")), os.chmod(os.path.join(cwd, "outputs",
                                                                                               "day"), 0o777)))
    proc = mtbench_cli("model=squeezenet", "batch=1", "steps=1", "warmup=0", "device=cpu",
                       f"hydra.run.dir={cwd}/outputs/day/job", cwd=cwd, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "belongs to uid 65534" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def record_in_a_job_folder(tmp_path: Path, victim: Path, text: str) -> Path:
    """A job folder of root's holding a 0600 power restore record that writes `text` into `victim`."""
    job = tmp_path / "job"
    job.mkdir()
    record = job / "power_restore.json"
    record.write_text(json.dumps({"root": "/", "files": [[str(victim).lstrip("/"), text]]}))
    os.chmod(record, 0o600)
    return record


def test_a_record_of_another_user_is_not_applied_even_in_roots_folder(tmp_path):
    from mtbench.device import power

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    record = record_in_a_job_folder(tmp_path, victim, "PWNED")
    os.chown(record, 65534, 65534)  # as if another user had put it there
    assert power.restore_left(record.parent, "/") is False
    assert bytes_and_mode(victim) == before


def test_a_record_for_another_sysfs_root_is_not_applied(tmp_path):
    from mtbench.device import power

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    record = record_in_a_job_folder(tmp_path, victim, "X")
    assert power.restore_left(record.parent, str(tmp_path / "fake-sysfs")) is False
    assert bytes_and_mode(victim) == before


def test_a_job_without_power_keys_reads_no_record(tmp_path):
    """The parent restored from whatever record lay in the job's folder after every job, power.* set or not."""
    from mtbench.job.isolation import restore_power

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    record = record_in_a_job_folder(tmp_path, victim, "X")
    job = record.parent
    restore_power(compose_cfg(["model=squeezenet"]), job)
    assert bytes_and_mode(victim) == before and (job / "power_restore.json").exists()


def test_the_jobs_record_is_written_through_no_planted_link(tmp_path):
    """`power_restore.json.tmp` (and the record's own name) planted as links into a root-only file."""
    from mtbench.device.power import PowerControl

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    folder = shared_folder()
    as_nobody(lambda: [os.symlink(victim, os.path.join(folder, name))
                       for name in ("power_restore.json.tmp", "power_restore.json")])
    control = PowerControl(compose_cfg(["model=squeezenet", "power.cpu_cores=1"]), Path(folder), torch.device("cpu"))
    control._write_record({"root": "/", "files": []})
    assert bytes_and_mode(victim) == before
    assert not os.path.islink(os.path.join(folder, "power_restore.json"))
    assert os.stat(os.path.join(folder, "power_restore.json")).st_uid == os.geteuid()


# 5. writes through links planted in folders other users can write

def test_the_one_writer_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    from mtbench.regular_files import create_fresh, write_whole
    from mtbench.results.files import atomic_write

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    folder = shared_folder()
    names = ["predict.json", "maxbatch.json", "probe.log", "figure.png", "cal.json"]
    as_nobody(lambda: [os.symlink(victim, os.path.join(folder, name)) for name in names])
    atomic_write(Path(folder) / "predict.json", "{}")
    atomic_write(Path(folder) / "maxbatch.json", "{}")
    write_whole(os.path.join(folder, "figure.png"), b"\x89PNG")
    with create_fresh(os.path.join(folder, "probe.log")) as log:
        log.write(b"probe\n")
    assert bytes_and_mode(victim) == before
    for name in names[:4]:
        assert not os.path.islink(os.path.join(folder, name)), name


def test_report_figures_replace_a_planted_link(tmp_path):
    """`mtbench report DIR` saved its figures through a DIR/report/<figure>.png link."""
    from mtbench.report.panels import save_png
    import matplotlib.pyplot as plt

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    folder = shared_folder()
    target = os.path.join(folder, "step_time_throughput.png")
    as_nobody(lambda: os.symlink(victim, target))
    fig = plt.figure()
    save_png(fig, Path(target))
    plt.close(fig)
    assert bytes_and_mode(victim) == before
    assert Path(target).read_bytes()[:4] == b"\x89PNG" and not os.path.islink(target)


def test_the_step_file_is_never_read_or_appended_through_a_link(tmp_path, monkeypatch):
    """mtbench-sample printed a planted steps.txt link's target's first line, and the marker appended to it."""
    from mtbench import marker
    from mtbench.commands.sample import read_marks

    victim = victim_file(tmp_path)
    before = bytes_and_mode(victim)
    folder = shared_folder()
    steps = os.path.join(folder, "steps.txt")
    as_nobody(lambda: os.symlink(victim, steps))
    marks, refused = read_marks(Path(steps), 0)
    assert marks == [] and len(refused) == 1 and "root's own bytes" not in refused[0]
    monkeypatch.setattr(marker, "_warned", True)  # the warning is said once, on stderr
    monkeypatch.setenv(marker.ENV, steps)
    marker.mark(1.0, 2.0)
    assert bytes_and_mode(victim) == before


def test_mlflow_uploads_regular_files_only(tmp_path):
    from mtbench.results.logger_backends import regular_files_under

    victim = victim_file(tmp_path)
    job = Path(shared_folder())
    (job / "summary.json").write_text("{}")
    (job / "sub").mkdir()
    (job / "sub" / "ops.csv").write_text("a\n")
    as_nobody(lambda: (os.symlink(victim, job / "stolen"), os.symlink(victim.parent, job / "stolen-folder"),
                       os.mkfifo(job / "fifo")))
    found = sorted((str(p.relative_to(job)), folder) for p, folder in regular_files_under(job))
    assert found == [("sub/ops.csv", "sub"), ("summary.json", None)]



@pytest.mark.parametrize("plant", ["a whole set", "an empty folder"])
def test_a_synthetic_set_another_user_planted_in_a_shared_cache_is_refused(tmp_path, plant):
    """Issue 51 item 8: `nobody` plants cifar10-synthetic-<n>-s0/cifar-10-batches-py/ with a `complete` marker and
    no images (or an empty folder root would write into) in a shared data.cache_dir; root's job read it (data:
    synthetic) or wrote into it. It is refused in one line, the planted files untouched."""
    need_root()
    from mtbench.data.ondisk import synthetic_cifar_root
    from mtbench.errors import DataError

    shared = shared_folder()

    def plant_set():
        folder = Path(shared) / "cifar10-synthetic-8-s0" / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        if plant == "a whole set":
            (folder / "complete").write_text("")
        for d in (folder, folder.parent):
            os.chmod(d, 0o777)

    as_nobody(plant_set)
    before = sorted(p.name for p in Path(shared).rglob("*"))
    with pytest.raises(DataError) as caught:
        synthetic_cifar_root(shared, per_file=8)
    message = str(caught.value)
    assert message.startswith(f"data.cache_dir={shared!r}: cannot use the synthetic CIFAR-10 files there")
    assert "belongs to another user (uid 65534), refused" in message and "\n" not in message
    assert sorted(p.name for p in Path(shared).rglob("*")) == before
    # this user's own set in the same shared folder is made and read
    own = Path(shared) / "mine"
    root = synthetic_cifar_root(str(own), per_file=8)
    assert (Path(root) / "cifar-10-batches-py" / "complete").is_file()
    assert synthetic_cifar_root(str(own), per_file=8) == root
