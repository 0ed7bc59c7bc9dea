"""A job the OOM killer ends on kernel 4.9 (L4T 32: TX2, Xavier on JetPack 4), which counts no kills: the kernel
log names the pid (issue 27 item 6). The log is a regular file here, in /dev/kmsg's record form, holding the lines
4.9 and 5.x print."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from mtbench.job import isolation
from tests.conftest import REPO
from tests.fake_workloads import _Base
from tests.helpers.env import child_env

# What 4.9's mm/oom_kill.c prints (the chosen process, then the one killed), and 5.x's one line (global OOM and
# a memory cgroup's), as /dev/kmsg gives them: "priority,sequence,microseconds,flags;text"
KMSG_4_9 = ("3,{seq},812345678,-;Out of memory: Kill process {pid} (python3) score 873 or sacrifice child\n"
            "3,{seq2},812345702,-;Killed process {pid} (python3) total-vm:9876543kB, anon-rss:6543210kB, "
            "file-rss:12345kB, shmem-rss:0kB\n")
KMSG_4_9_CHOSEN_ONLY = "3,{seq},812345678,-;Out of memory: Kill process {pid} (python3) score 873 or sacrifice child\n"
KMSG_5_X = ("3,{seq},1512345678,-;Out of memory: Killed process {pid} (python3) total-vm:9876543kB, "
            "anon-rss:6543210kB, file-rss:12345kB, shmem-rss:0kB, UID:0 pgtables:14000kB oom_score_adj:0\n"
            " SUBSYSTEM=memory\n")
KMSG_5_X_CGROUP = ("3,{seq},1512345678,-;Memory cgroup out of memory: Killed process {pid} (python3) "
                   "total-vm:9876543kB, anon-rss:6543210kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:14000kB "
                   "oom_score_adj:0\n")
OTHER = "6,{seq},700000000,-;usb 1-2: new high-speed USB device number 3 using tegra-xusb\n"


@pytest.fixture
def kernel_4_9(monkeypatch, tmp_path):
    """A kernel without oom_kill counters (neither /proc/vmstat nor the memory cgroup's files have them)."""
    monkeypatch.setattr(isolation, "_memcg_oom_file", lambda: None)
    monkeypatch.setattr(isolation, "_read_oom_kill", lambda path: None)
    monkeypatch.setattr(isolation, "_own_comm", lambda: b"mtbench")  # not the python3 the log lines name
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(OTHER.format(seq=100) + KMSG_4_9.format(seq=101, seq2=102, pid=4242))  # a kill before the job
    return kmsg


@pytest.mark.parametrize("lines", [KMSG_4_9, KMSG_4_9_CHOSEN_ONLY, KMSG_5_X, KMSG_5_X_CGROUP])
def test_the_kernel_log_naming_the_jobs_pid_makes_a_sigkill_oom(kernel_4_9, lines):
    kills = isolation.OomKills(kmsg_path=str(kernel_4_9))
    with open(kernel_4_9, "a") as f:  # what the kernel logs while the job runs
        f.write(OTHER.format(seq=103) + lines.format(seq=104, seq2=105, pid=5151))
    failure = isolation.killed_failure(-signal.SIGKILL, kills.since(5151))
    assert failure["kind"] == "oom" and "OOM killer" in failure["message"], failure
    assert "process 5151 (python3)" in failure["message"]


def test_an_older_kill_of_a_reused_pid_does_not_count(kernel_4_9):
    kills = isolation.OomKills(kmsg_path=str(kernel_4_9))  # the log already says 4242 was killed, before the job
    with open(kernel_4_9, "a") as f:
        f.write(OTHER.format(seq=103))
    failure = isolation.killed_failure(-signal.SIGKILL, kills.since(4242))
    assert failure["kind"] == "killed" and "names no OOM kill" in failure["message"], failure


def test_another_pids_kill_is_not_this_jobs(kernel_4_9):
    kills = isolation.OomKills(kmsg_path=str(kernel_4_9))
    with open(kernel_4_9, "a") as f:
        f.write(KMSG_5_X.format(seq=103, pid=51510))  # 5151 is a prefix of it
    assert isolation.killed_failure(-signal.SIGKILL, kills.since(5151))["kind"] == "killed"


def test_an_unreadable_log_says_the_kernel_does_not_count(kernel_4_9, tmp_path):
    kills = isolation.OomKills(kmsg_path=str(tmp_path / "absent"))  # not root, or a container without /dev/kmsg
    failure = isolation.killed_failure(-signal.SIGKILL, kills.since(5151))
    assert failure["kind"] == "killed"
    assert "SIGKILL; the OOM killer is possible, this kernel does not count its kills" in failure["message"]


def test_a_link_is_not_followed(kernel_4_9, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(kernel_4_9)
    assert isolation.OomKills(kmsg_path=str(link)).kmsg_after is None


def test_a_kernel_that_counts_kills_is_not_asked_its_log(monkeypatch, tmp_path):
    monkeypatch.setattr(isolation, "_memcg_oom_file", lambda: None)
    monkeypatch.setattr(isolation, "_read_oom_kill", lambda path: 7)  # /proc/vmstat's oom_kill (4.13+)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG_5_X.format(seq=1, pid=5151))
    kills = isolation.OomKills(kmsg_path=str(kmsg)).since(5151)
    assert kills["kmsg"] is None
    assert isolation.killed_failure(-signal.SIGKILL, kills) == {
        "kind": "killed", "message": "the job's process was killed by signal 9 (SIGKILL)"}


# A sweep's parent on kernel 4.9: the job's process logs its own OOM kill as the kernel would, then dies of SIGKILL
_PARENT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from mtbench import config
from mtbench.job import isolation
from tests.conftest import compose_cfg
config.ALLOWED_TARGET_PREFIXES += ("tests.",)
isolation._memcg_oom_file = lambda: None
isolation._read_oom_kill = lambda path: None
isolation.KMSG = {kmsg!r}
print(json.dumps(isolation.run_isolated(compose_cfg(sys.argv[2:]), Path(sys.argv[1]))))
"""


class KilledByTheKernel(_Base):
    """A workload whose first step writes the 4.9 kernel's OOM lines for its own pid, then gets SIGKILL."""

    def __init__(self, kmsg: str) -> None:
        self.kmsg = kmsg

    def step(self) -> None:
        with open(self.kmsg, "a") as f:
            f.write(KMSG_4_9.format(seq=201, seq2=202, pid=os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_job_the_oom_killer_ends_on_kernel_4_9_is_oom(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(OTHER.format(seq=200))
    script = _PARENT.format(repo=str(REPO), kmsg=str(kmsg))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "job"), "model=squeezenet",
                           "~model.workload.net", "~model.workload.optimizer", "~model.workload.input_shape",
                           "~model.workload.num_classes",
                           "model.workload._target_=tests.device.test_oom.KilledByTheKernel",
                           f"+model.workload.kmsg={kmsg}"],
                          cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["failure"]["kind"] == "oom" and "Killed process" in s["failure"]["message"], s["failure"]


@pytest.mark.parametrize("lines", [KMSG_4_9, KMSG_5_X])
def test_in_a_container_the_hosts_pid_is_matched_by_the_process_name(kernel_4_9, lines, monkeypatch):
    """Inside a container's pid namespace the kernel log names the host's pid (98765), never the job's (5151): a
    kill of a process with the job's name logged while it ran is the job's, and the message says how it matched."""
    monkeypatch.setattr(isolation, "_own_comm", lambda: b"python3")
    kills = isolation.OomKills(kmsg_path=str(kernel_4_9))
    with open(kernel_4_9, "a") as f:
        f.write(OTHER.format(seq=103) + lines.format(seq=104, seq2=105, pid=98765))
    failure = isolation.killed_failure(-signal.SIGKILL, kills.since(5151))
    assert failure["kind"] == "oom", failure
    assert "Killed process 98765 (python3)" in failure["message"]
    assert "matched by the process name" in failure["message"]


def test_a_kill_of_another_name_is_not_matched_by_name(kernel_4_9, monkeypatch):
    monkeypatch.setattr(isolation, "_own_comm", lambda: b"mtbench")
    kills = isolation.OomKills(kmsg_path=str(kernel_4_9))
    with open(kernel_4_9, "a") as f:
        f.write(KMSG_5_X.format(seq=103, pid=98765))  # a python3 of a neighbour's
    assert isolation.killed_failure(-signal.SIGKILL, kills.since(5151))["kind"] == "killed"
