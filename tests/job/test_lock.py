"""The device lock in a folder every user can write: a link, FIFO or hard link another user planted there is
refused, and no other file's bytes or mode change (the planting is done as user nobody, the lock taken as root)."""
from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import pytest
import torch

from mtbench.errors import UsageError
from mtbench.job.lock import DeviceLock
from tests.helpers.hostile import as_nobody
from tests.helpers.lock import held_lock
from tests.helpers.run_if import run_if

pytestmark = run_if(root=True, why="to plant files as another user (setuid to nobody)")


@pytest.fixture
def shared():
    """A folder every user may write, without the sticky bit (a shared MTBENCH_LOCK_DIR as a README might
    suggest): the kernel's fs.protected_symlinks guards only sticky world-writable folders."""
    folder = tempfile.mkdtemp(dir="/tmp")
    os.chmod(folder, 0o777)
    yield folder
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def victim_file(tmp_path):
    victim = tmp_path / "root-only" / "victim"
    victim.parent.mkdir()
    os.chmod(victim.parent, 0o700)
    victim.write_bytes(b"root's own bytes\n")
    os.chmod(victim, 0o600)
    return victim


def lock(folder: str, mode: str = "wait") -> DeviceLock:
    return DeviceLock(torch.device("cpu"), mode, folder)


def test_a_link_to_roots_file_is_refused_and_the_file_is_untouched(shared, tmp_path):
    victim = victim_file(tmp_path)
    before = victim.read_bytes(), stat.S_IMODE(victim.stat().st_mode)
    as_nobody(lambda: os.symlink(victim, os.path.join(shared, "mtbench-cpu.lock")))
    with pytest.raises(UsageError) as err:
        lock(shared).acquire()
    assert "is a symbolic link, refused" in str(err.value) and "\n" not in str(err.value)
    assert (victim.read_bytes(), stat.S_IMODE(victim.stat().st_mode)) == before


def test_a_dangling_link_into_a_root_only_folder_creates_nothing(shared, tmp_path):
    target = tmp_path / "root-only"
    target.mkdir()
    os.chmod(target, 0o700)
    as_nobody(lambda: os.symlink(target / "cron-job", os.path.join(shared, "mtbench-cpu.lock")))
    with pytest.raises(UsageError, match="is a symbolic link, refused"):
        lock(shared).acquire()
    assert not (target / "cron-job").exists()


def test_a_planted_fifo_is_refused_without_blocking(shared):
    as_nobody(lambda: os.mkfifo(os.path.join(shared, "mtbench-cpu.lock")))
    with pytest.raises(UsageError, match="is not a regular file, refused"):
        lock(shared).acquire()


def test_a_hard_link_to_roots_file_is_refused(shared, tmp_path):
    victim = victim_file(tmp_path)
    os.link(victim, os.path.join(shared, "mtbench-cpu.lock"))  # root may; nobody may not (protected_hardlinks)
    with pytest.raises(UsageError, match="has 2 hard links"):
        lock(shared).acquire()
    assert victim.read_bytes() == b"root's own bytes\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_another_users_lock_file_is_locked_but_never_rewritten(shared):
    path = os.path.join(shared, "mtbench-cpu.lock")

    def plant():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"nobody's bytes")
        os.close(fd)

    as_nobody(plant)
    held = lock(shared, "fail")
    held.acquire()
    try:
        with open(path, "rb") as f:
            assert f.read() == b"nobody's bytes"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        with pytest.raises(UsageError, match="being measured by another mtbench job"):
            lock(shared, "fail").acquire()  # the read-only flock still excludes
    finally:
        held.release()


def test_a_lock_this_call_creates_is_shared_with_every_user(shared):
    held = lock(shared)
    held.acquire()
    held.release()
    path = os.path.join(shared, "mtbench-cpu.lock")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    with open(path) as f:
        assert f.read() == str(os.getpid())


@pytest.mark.parametrize("folder", ["", "relative/locks"])
def test_a_lock_dir_that_is_not_absolute_is_refused(folder):
    with pytest.raises(UsageError, match="is not an absolute folder"):
        lock(folder)
    lock(folder, "off").acquire()  # no lock, no folder needed


@pytest.mark.slow
def test_an_empty_MTBENCH_LOCK_DIR_is_one_line(tmp_path):
    import subprocess
    import sys

    from tests.helpers.env import child_env

    env = child_env(MTBENCH_LOCK_DIR="")
    proc = subprocess.run([sys.executable, "-m", "mtbench", "model=squeezenet", "batch=1", "steps=1", "warmup=0",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "lock_dir=''" in lines[0] and "not an absolute folder" in lines[0], lines
    assert not list(tmp_path.glob("*.lock"))


def test_a_lock_dir_that_is_a_link_is_refused_and_nothing_lands_where_it_points(tmp_path):
    """`ln -s /etc/bash_completion.d /tmp/s/lk` as nobody, then root's `lock_dir=/tmp/s/lk`: following it made a
    root-owned 0666 lock file in the folder the link names."""
    from tests.helpers.hostile import shared_folder

    target = tmp_path / "root-only"
    target.mkdir()
    os.chmod(target, 0o755)
    link = os.path.join(shared_folder(), "lk")
    as_nobody(lambda: os.symlink(target, link))
    with pytest.raises(UsageError) as err:
        lock(link).acquire()
    assert "is a symbolic link, refused" in str(err.value) and "\n" not in str(err.value)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o1777, False), (0o755, False)])
def test_a_lock_dir_of_another_user_is_refused_where_others_may_write_it(mode, refused):
    from tests.helpers.hostile import shared_folder

    folder = os.path.join(shared_folder(), "theirs")

    def make() -> None:
        os.mkdir(folder)
        os.chmod(folder, mode)

    as_nobody(make)
    device_lock = lock(folder)
    if refused:
        with pytest.raises(UsageError, match="belongs to uid 65534 and other users may write it"):
            device_lock.acquire()
        assert os.listdir(folder) == []
        return
    try:
        device_lock.acquire()  # 0755: root may still create there; sticky: as /tmp
    finally:
        device_lock.release()


def test_the_power_restore_file_is_not_kept_in_a_linked_folder(tmp_path):
    from mtbench.device import power_record

    from tests.helpers.hostile import shared_folder

    root = shared_folder()  # a board tree in a folder others may write, sticky as /tmp
    os.mkdir(os.path.join(root, "run"), 0o1777)
    os.chmod(os.path.join(root, "run"), 0o1777)
    as_nobody(lambda: os.symlink(tmp_path, os.path.join(root, "run", "mtbench")))
    with pytest.raises(UsageError, match="is a symbolic link, refused"):
        power_record.path_for(root)


@pytest.mark.parametrize("text, named", [(b"\x1b[2J\x1b[31mOWNED\x07", "pid unknown"), (b"999999999", "pid unknown"),
                                         (b"0", "pid unknown")])
def test_a_waiting_job_never_prints_what_another_user_wrote_in_the_lock(tmp_path, capsys, text, named):
    """Issue 51 item 14: the 32 bytes of the lock file were printed as they were (terminal escapes included); now
    only the pid of a live process is named."""
    fd = held_lock(tmp_path, text)
    try:
        lock = DeviceLock(torch.device("cpu"), "wait", str(tmp_path), timeout_s=0.3)
        with pytest.raises(UsageError) as caught:
            lock.acquire()
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert "\x1b" not in err + str(caught.value) and "OWNED" not in err + str(caught.value)
    assert f"another mtbench job ({named}) is measuring it, at most 0.3 s (lock_timeout_s)" in err
    assert str(caught.value).startswith(f"cpu is still being measured by another mtbench job ({named}) after 0.3 s "
                                        "(lock_timeout_s)") and "\n" not in str(caught.value)


def test_a_live_holder_is_named_and_the_time_waited_is_said(tmp_path, capsys):
    import threading

    fd = held_lock(tmp_path, str(os.getpid()).encode())
    threading.Timer(0.5, os.close, args=(fd,)).start()  # the holder ends half a second later
    lock = DeviceLock(torch.device("cpu"), "wait", str(tmp_path), timeout_s=30)
    lock.acquire()
    lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"mtbench: waiting for cpu: another mtbench job (pid {os.getpid()}: ")
    assert err[1].startswith("mtbench: cpu is free after ") and err[1].endswith(" s of waiting")


def test_the_holders_command_is_named_in_printable_characters(tmp_path, capsys):
    """Issue 52 item 5: the waiting line names the holder's command (the kernel's, printable characters only: a
    command line is any user's text)."""
    import subprocess
    import sys
    import threading

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "\x1b[31mred"])
    try:
        # Popen returns when exec closes its pipe, before the kernel has set the new command line: on a busy machine
        # /proc/N/cmdline read empty (the line named no command); the holder is taken once it is there
        deadline = time.monotonic() + 60
        while not Path(f"/proc/{holder.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        fd = held_lock(tmp_path, str(holder.pid).encode())
        threading.Timer(0.5, os.close, args=(fd,)).start()
        lock = DeviceLock(torch.device("cpu"), "wait", str(tmp_path), timeout_s=30)
        lock.acquire()
        lock.release()
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    command = f"{sys.executable} -c import time; time.sleep(60) [31mred"
    command = command if len(command) <= 100 else command[:100] + "..."
    assert err[0] == (f"mtbench: waiting for cpu: another mtbench job (pid {holder.pid}: {command}) is measuring it, "
                      "at most 30 s (lock_timeout_s)")


def test_lock_timeout_s_is_checked_as_any_setting():
    with pytest.raises(UsageError, match=r"lock_timeout_s=-1 is not allowed; allowed: null or a number of seconds"):
        DeviceLock(torch.device("cpu"), "wait", "/tmp", timeout_s=-1)


@pytest.mark.slow
def test_a_data_source_that_cannot_be_made_is_refused_before_waiting_for_the_device(tmp_path):
    """Issue 52 item 5: data=cifar10 without data.root waited for another job's device first, then failed."""
    from tests.conftest import mtbench_cli

    fd = held_lock(tmp_path, b"")
    try:
        proc = mtbench_cli("model=squeezenet", "data=cifar10", "device=cpu", "steps=1", "warmup=0",
                           f"lock_dir={tmp_path}", "lock_timeout_s=120", f"hydra.run.dir={tmp_path / 'run'}")
    finally:
        os.close(fd)
    assert proc.returncode == 2, proc.stderr
    assert "data=cifar10 needs data.root=DIR" in proc.stderr and "waiting for cpu" not in proc.stderr, proc.stderr
