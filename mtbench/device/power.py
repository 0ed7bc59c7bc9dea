"""Power modes, clocks and cores as job settings (power.*): applied before the model is built, read back, restored."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mtbench.config import setting
from mtbench.device import power_nvml as nvml, power_record as machine, power_sysfs as fs
from mtbench.errors import UsageError

KEYS = ("nvpmodel", "cpu_cores", "cpu_max_khz", "gpu_max_hz", "emc_max_hz", "governor", "lock_clocks",
        "gpu_power_limit_w", "gpu_locked_clocks_mhz")
# What the job's process writes before it changes anything: the parent restores from it should the process die
RECORD = "power_restore.json"
ROOT_ENV = "MTBENCH_SYSFS_ROOT"  # tells a fake nvpmodel (tests) which tree to change; the real one ignores it


def sysfs_root(cfg: Any) -> str:
    """power.sysfs_root, else sampler.sysfs_root, else /."""
    sampler = cfg.get("sampler") or {}
    return str(setting(cfg, "power.sysfs_root") or sampler.get("sysfs_root") or "/")


def asked(cfg: Any) -> Dict[str, Any]:
    """The power.* keys of `cfg`, each as set or None (lock_clocks False)."""
    return {k: setting(cfg, f"power.{k}", False if k == "lock_clocks" else None) for k in KEYS}


def asks_any(values: Dict[str, Any]) -> bool:
    """Whether any power.* key is set: `is not`, as power.nvpmodel=0 (MAXN) and cpu_cores=0 are values."""
    return any(v is not None and v is not False for v in values.values())


def say(line: str) -> None:
    print(f"mtbench: power: {line}", file=sys.stderr, flush=True)


class PowerControl:
    """One job's power settings: `apply` (before the model is built), `summary`, `restore` (whatever ended it)."""

    def __init__(self, cfg: Any, out_dir: Path, device: Any) -> None:
        self.asked = asked(cfg)
        self.root = sysfs_root(cfg)
        self.record_path = Path(out_dir) / RECORD
        self.device = device
        self.read_back: Optional[Dict[str, Any]] = None
        self.clamped: List[str] = []
        self.saved: Optional[Tuple[Any, int]] = None  # this process's CPU affinity and torch threads before
        # set in a sweep's jobs (campaign/power_hold.py): {path, pid, start} of the sweep's record; the sweep restores
        hold = os.environ.get(machine.HOLD_ENV)
        self.hold: Optional[Dict[str, Any]] = json.loads(hold) if hold else None
        self.wrote_record = False  # this process wrote the job's record: only then does it restore from one

    @property
    def active(self) -> bool:
        return asks_any(self.asked)

    def summary(self) -> Optional[Dict[str, Any]]:
        """summary.json's power_mode: what was asked, what the device reports, the clocks it clamped."""
        if not self.active:
            return None
        return {"asked": {k: v for k, v in self.asked.items() if v is not None and v is not False},
                "read_back": self.read_back, "clamped": list(self.clamped)}

    # -- apply --------------------------------------------------------------------------------------------------
    def apply(self) -> None:
        """Check every knob asked (UsageError: one line, nothing changed), record what the device has, then set."""
        if not self.active:
            if self.hold is not None:  # a sweep's job without power.* after one with: the device as the sweep found it
                held = self._claim(self.hold["path"], device_wide=False)
                if held is not None and held.get("last_asked") != self.asked:
                    restore_record(held)
                    machine.write(self.hold["path"], {**held, "last_asked": self.asked})
            return
        a, root = self.asked, self.root
        jetson, files, mode, cores = self.check()
        gpu_index = self._gpu_index()
        path = self.hold["path"] if self.hold is not None else machine.path_for(self.root)
        # cores alone off a Jetson change only this process (affinity, threads): no machine file, no other run's
        device_wide = bool(files) or mode is not None or gpu_index is not None
        held = self._claim(path, device_wide) if device_wide or self.hold is not None else None  # a dead run's first
        unchanged = held is not None and held.get("last_asked") == self.asked  # the sweep's job before asked the same
        if held is not None and held.get("root") and not unchanged:  # as the sweep found the device, then this job's
            restore_record(held)
        record = {"root": root, "nvpmodel": fs.nvpmodel_mode(root) if mode is not None else None,
                  "files": [[rel, fs.read_attr(root, rel)] for rel in files if fs.read_attr(root, rel) is not None],
                  "nvml": nvml.snapshot(gpu_index) if gpu_index is not None else None,
                  "nvml_locked": a["gpu_locked_clocks_mhz"] is not None}
        # before any change: the machine's file (a crash of mtbench itself) and, outside a sweep, the job's own
        if self.hold is not None and (device_wide or held is not None):
            machine.write(path, {**machine.merge(held or {}, record), "pid": self.hold["pid"],
                                 "start": self.hold["start"], "last_asked": self.asked})
        elif self.hold is None:
            if device_wide:
                record.update(machine.owner(), machine_file=path)
                machine.write(path, {**record, "job_record": str(self.record_path)})
            self._write_record(record)
        if mode is not None and not unchanged:  # first: a mode sets cores and clocks that the keys below refine
            self._nvpmodel(mode)
        if cores is not None:
            self._set_cores(cores, jetson)
        self._set_clocks(cores)
        back = nvml.apply(gpu_index, a["gpu_power_limit_w"], a["gpu_locked_clocks_mhz"]) if gpu_index is not None \
            else {}
        self.read_back = {**self._read_back(cores), **back}
        self._say_clamps()

    def check(self) -> Tuple[bool, List[str], Optional[int], Optional[List[int]]]:
        """What `apply` checks before it changes anything (also a sweep's values, before its first job): UsageError
        (one line); else (a Jetson?, the files the keys may change, the nvpmodel mode id, the cores)."""
        a, jetson = self.asked, fs.is_jetson(self.root)
        files = self.check_access(jetson)
        mode = self._mode_id() if a["nvpmodel"] is not None else None
        if mode is not None and shutil.which("nvpmodel") is None:
            raise UsageError(f"power.nvpmodel={a['nvpmodel']!r}: no nvpmodel program on PATH (JetPack's nvpmodel)")
        cores = self._cores(jetson) if a["cpu_cores"] is not None else None
        if a["governor"] is not None:
            self._check_governor()
        return jetson, files, mode, cores

    def check_access(self, jetson: bool) -> List[str]:
        """The files the asked keys may change; UsageError (one line) where this user may not write one of them."""
        files, root = self._files(jetson), self.root
        denied = [rel for rel in files if os.path.exists(os.path.join(root, rel)) and not fs.writable(root, rel)]
        if denied:
            raise UsageError(f"power settings need write access to {os.path.join(root, denied[0])} "
                             f"({len(denied)} file(s)); run as root (sudo) or leave power.* null")
        return files

    def _claim(self, path: str, device_wide: bool) -> Optional[Dict[str, Any]]:
        """The sweep's record at `path` (None outside a sweep, or before its first change); a record a run left
        that died is restored and removed, one line said; another live run's is a UsageError where this job
        changes the device (`device_wide`), else left alone."""
        found = machine.read(path)
        if found is None:
            return None
        hold = self.hold
        if hold is not None and found.get("pid") == hold["pid"] and found.get("start") == hold["start"]:
            return found
        if machine.alive(found) and found.get("pid") != os.getpid():  # this process's own: a job that did not restore
            if not device_wide:
                return None
            raise UsageError(f"another mtbench run (pid {found.get('pid')}) has changed this device's power settings "
                             f"and will restore them ({path}); wait for it to end, or leave power.* null")
        restore_leftover(path, found)
        return None

    def _files(self, jetson: bool) -> List[str]:
        """Every sysfs file the asked keys may change (nvpmodel changes them all): checked, recorded, restored."""
        a, root, out = self.asked, self.root, []
        every = a["nvpmodel"] is not None
        if jetson and (every or a["cpu_cores"] is not None):
            out += [fs.online_file(n) for n in fs.cpus(root)]
        if every or a["cpu_max_khz"] is not None or a["governor"] is not None or a["lock_clocks"]:
            out += [fs.cpufreq(n, f) for n in fs.cpus(root)
                    for f in ("scaling_max_freq", "scaling_min_freq", "scaling_governor")]
        gpu = fs.gpu_devfreq(root)
        if a["gpu_max_hz"] is not None and gpu is None:
            raise UsageError(f"power.gpu_max_hz={a['gpu_max_hz']}: no GPU devfreq node under "
                             f"{os.path.join(root, 'sys/class/devfreq')} (a Jetson's); on a CUDA GPU use "
                             "power.gpu_locked_clocks_mhz or power.gpu_power_limit_w")
        if gpu is not None and (every or a["gpu_max_hz"] is not None or a["lock_clocks"]):
            out += [f"{gpu}/max_freq", f"{gpu}/min_freq"]
        emc = fs.emc_max_file(root)
        if a["emc_max_hz"] is not None and emc is None:
            raise UsageError(f"power.emc_max_hz={a['emc_max_hz']}: this board exposes no EMC cap under {root} "
                             f"(an emc devfreq node or {fs.EMC_CAP})")
        if emc is not None and (every or a["emc_max_hz"] is not None):
            out.append(emc)
        return [rel for rel in out if os.path.exists(os.path.join(root, rel))]

    def _mode_id(self) -> int:
        modes, asked = fs.nvpmodel_modes(self.root), self.asked["nvpmodel"]
        listed = ", ".join(f"{i} ({n})" for i, n in sorted(modes.items())) or f"none ({fs.NVPMODEL_CONF} not found)"
        for mode_id, name in modes.items():
            if asked == mode_id or str(asked) == name or str(asked) == str(mode_id):
                return mode_id
        raise UsageError(f"power.nvpmodel={asked!r} is not a mode of this board; allowed: {listed}")

    def _cores(self, jetson: bool) -> List[int]:
        """The cores the job gets: the first N (of the board's cores on a Jetson, of this process's elsewhere)."""
        asked = self.asked["cpu_cores"]
        pool = fs.cpus(self.root) if jetson else sorted(os.sched_getaffinity(0))
        where = "this board's cores" if jetson else "the cores this process may use"
        if isinstance(asked, int):
            if asked > len(pool):
                raise UsageError(f"power.cpu_cores={asked} is out of range; allowed: 1-{len(pool)} ({where}: "
                                 f"{','.join(map(str, pool))})")
            return pool[:asked]
        unknown = [c for c in asked if c not in pool]
        if unknown:
            raise UsageError(f"power.cpu_cores={asked}: core(s) {unknown} not among {where} "
                             f"({','.join(map(str, pool))})")
        return sorted(asked)

    def _check_governor(self) -> None:
        cpu = fs.online_cpus(self.root)[0] if fs.online_cpus(self.root) else 0
        allowed = (fs.read_attr(self.root, fs.cpufreq(cpu, "scaling_available_governors")) or "").split()
        if not allowed:
            raise UsageError(f"power.governor={self.asked['governor']!r}: no cpufreq under "
                             f"{os.path.join(self.root, fs.CPU_DIR)}")
        if self.asked["governor"] not in allowed:
            raise UsageError(f"power.governor={self.asked['governor']!r} is not known; allowed: {', '.join(allowed)}")

    def _gpu_index(self) -> Optional[int]:
        if self.asked["gpu_power_limit_w"] is None and self.asked["gpu_locked_clocks_mhz"] is None:
            return None
        if getattr(self.device, "type", "cpu") != "cuda":
            raise UsageError("power.gpu_power_limit_w / power.gpu_locked_clocks_mhz need a CUDA GPU "
                             f"(this job runs on {self.device}); on a Jetson use power.gpu_max_hz")
        return int(self.device.index or 0)

    def _write_record(self, record: Dict[str, Any]) -> None:
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        machine.write(str(self.record_path), record)  # a fresh 0600 file renamed into place: no planted link
        self.wrote_record = True

    def _nvpmodel(self, mode: int) -> None:
        proc = subprocess.run(["nvpmodel", "-m", str(mode)], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, env={**os.environ, ROOT_ENV: self.root})
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip() or "no message").splitlines()[-1]
            raise UsageError(f"power.nvpmodel={self.asked['nvpmodel']!r}: nvpmodel -m {mode} failed "
                             f"(exit {proc.returncode}): {last}")
        why = fs.nvpmodel_not_applied(self.root, mode, proc.stdout + "\n" + proc.stderr)
        if why is not None:
            raise UsageError(f"power.nvpmodel={self.asked['nvpmodel']!r}: {why}")

    def _set_cores(self, cores: List[int], jetson: bool) -> None:
        import torch

        if jetson:  # as nvpmodel does: the chosen cores online first, then the others off
            for n in cores:
                if os.path.exists(os.path.join(self.root, fs.online_file(n))):
                    self._write(fs.online_file(n), "1", "cpu_cores")
            for n in fs.cpus(self.root):
                if n not in cores and os.path.exists(os.path.join(self.root, fs.online_file(n))):
                    self._write(fs.online_file(n), "0", "cpu_cores")
        self.saved = (os.sched_getaffinity(0), torch.get_num_threads())
        allowed = sorted(set(cores) & self.saved[0]) or sorted(self.saved[0])  # a fake tree's cores vs this host
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(len(cores))  # one intra-op thread per core: more would time-share them

    def _set_clocks(self, cores: Optional[List[int]]) -> None:
        a, root = self.asked, self.root
        online = [n for n in (cores if cores is not None and fs.is_jetson(root) else fs.online_cpus(root))
                  if os.path.exists(os.path.join(root, fs.cpufreq(n, "scaling_max_freq")))]
        for n in online:
            if a["governor"] is not None:
                self._write(fs.cpufreq(n, "scaling_governor"), a["governor"], "governor")
            if a["cpu_max_khz"] is not None:
                self._write(fs.cpufreq(n, "scaling_max_freq"), str(a["cpu_max_khz"]), "cpu_max_khz")
            if a["lock_clocks"]:
                top = fs.read_attr(root, fs.cpufreq(n, "scaling_max_freq"))
                if top:
                    self._write(fs.cpufreq(n, "scaling_min_freq"), top, "lock_clocks")
        gpu = fs.gpu_devfreq(root)
        if gpu is not None and a["gpu_max_hz"] is not None:
            self._write(f"{gpu}/max_freq", str(a["gpu_max_hz"]), "gpu_max_hz")
        if gpu is not None and a["lock_clocks"] and fs.read_attr(root, f"{gpu}/max_freq"):
            self._write(f"{gpu}/min_freq", str(fs.read_attr(root, f"{gpu}/max_freq")), "lock_clocks")
        if a["emc_max_hz"] is not None:
            self._write(str(fs.emc_max_file(root)), str(a["emc_max_hz"]), "emc_max_hz")

    def _write(self, rel: str, value: str, key: str) -> None:
        try:
            fs.write_attr(self.root, rel, value)
        except OSError as exc:  # the kernel refused the value (EINVAL) or the file (a link)
            raise UsageError(f"power.{key}: writing {value} to {os.path.join(self.root, rel)} failed: "
                             f"{exc.strerror or exc}") from None

    def _read_back(self, cores: Optional[List[int]]) -> Dict[str, Any]:
        a, root, out = self.asked, self.root, {}  # type: ignore[var-annotated]
        online = fs.online_cpus(root)
        if a["nvpmodel"] is not None:
            mode = fs.nvpmodel_mode(root)
            out["nvpmodel"] = {"id": mode, "name": fs.nvpmodel_modes(root).get(mode) if mode is not None else None}
        if cores is not None:
            import torch

            out["cpu_cores"] = sorted(os.sched_getaffinity(0))
            out["torch_threads"] = torch.get_num_threads()
            if fs.is_jetson(root):
                out["cpus_online"] = online
        for key, name in (("cpu_max_khz", "scaling_max_freq"), ("governor", "scaling_governor")):
            if a[key] is not None or (key == "cpu_max_khz" and a["lock_clocks"]):
                values = sorted(set(v for v in (fs.read_attr(root, fs.cpufreq(n, name)) for n in online) if v))
                out[key] = [fs.as_int(v) if key != "governor" else v for v in values]
                if len(out[key]) == 1:
                    out[key] = out[key][0]
        gpu = fs.gpu_devfreq(root)
        if gpu is not None and (a["gpu_max_hz"] is not None or a["lock_clocks"] or a["nvpmodel"] is not None):
            out["gpu_max_hz"] = fs.as_int(fs.read_attr(root, f"{gpu}/max_freq"))
            out["gpu_min_hz"] = fs.as_int(fs.read_attr(root, f"{gpu}/min_freq"))
        if a["emc_max_hz"] is not None:
            out["emc_max_hz"] = fs.as_int(fs.read_attr(root, str(fs.emc_max_file(root))))
        return out

    def _say_clamps(self) -> None:
        """A clock the board set other than asked: one line each; the job runs at the read-back figure."""
        assert self.read_back is not None
        for key in ("cpu_max_khz", "gpu_max_hz", "emc_max_hz"):
            asked, got = self.asked[key], self.read_back.get(key)
            if asked is not None and got != asked:
                self.clamped.append(key)
                say(f"power.{key}={asked} asked, the board set {got}; the job runs at {got}")
        if self.asked["cpu_cores"] is not None and len(self.read_back["cpu_cores"]) != self.read_back["torch_threads"]:
            self.clamped.append("cpu_cores")
            say(f"power.cpu_cores={self.asked['cpu_cores']}: this process may use cores "
                f"{self.read_back['cpu_cores']} only; torch runs {self.read_back['torch_threads']} threads")

    # -- restore ------------------------------------------------------------------------------------------------
    def restore(self) -> None:
        """Put back what `apply` changed (this process's affinity and threads too); never raises. In a sweep the
        device keeps the job's settings: the next job with the same ones changes nothing, the sweep restores."""
        if self.saved is not None:
            import torch

            os.sched_setaffinity(0, self.saved[0])
            torch.set_num_threads(self.saved[1])
            self.saved = None
        if self.hold is None and self.wrote_record:
            restore_left(self.record_path.parent, self.root)
            self.wrote_record = False


def restore_leftover(path: str, record: Dict[str, Any]) -> None:
    """Restore what a run that died left on the device (the machine's restore file), remove the file, say so."""
    restore_record(record)
    machine.remove(path)
    say(f"a run that ended without restoring the device (pid {record.get('pid')}) left {path}: restored the "
        "settings it recorded")


def restore_left(out_dir: Path, root: str) -> bool:
    """Restore from the record a job's process wrote in `out_dir` before changing the device, and remove it; False
    where there is none (the job changed nothing, or restored itself). Each failure is said in one line.

    Root acts on what the record says, so it is read as the machine's file is (power_record.read: a regular file of
    one name, this user's, writable by no other) and its sysfs root must be the job's own (`root`): a record
    another user planted in the job's folder is refused, never applied."""
    path = Path(out_dir) / RECORD
    try:
        record = machine.read(str(path))
    except UsageError as exc:
        say(f"{exc}; not restored from it")
        return False
    if record is None:
        return False
    if str(record.get("root") or "/") != str(root):
        say(f"the restore record {path} names sysfs root {str(record.get('root'))[:80]!r}, not the job's {root!r}: "
            "refused, not restored from it")
        return False
    restore_record(record)
    try:
        path.unlink()
    except OSError:
        pass
    if record.get("machine_file"):  # the machine's copy, where this job's process wrote it
        machine.remove(str(record["machine_file"]), record.get("pid"))
    return True


def restore_record(record: Dict[str, Any]) -> None:
    """Put the device back as `record` says (nvpmodel mode, files, NVML); each failure said in one line."""
    root = str(record.get("root") or "/")
    if record.get("nvpmodel") is not None and fs.nvpmodel_mode(root) != record["nvpmodel"]:
        try:
            proc = subprocess.run(["nvpmodel", "-m", str(record["nvpmodel"])], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=120, env={**os.environ, ROOT_ENV: root})
            if proc.returncode != 0:
                say(f"restoring nvpmodel mode {record['nvpmodel']} failed (exit {proc.returncode})")
        except (OSError, subprocess.TimeoutExpired) as exc:  # no nvpmodel on PATH, or one that hangs
            say(f"restoring nvpmodel mode {record['nvpmodel']} failed: {exc}")
    # cores online first (an offline core's cpufreq files may be absent), then the clocks; twice, as a max below
    # the current min (or a min above the max) may be refused until its partner is back
    files = sorted(record.get("files") or [], key=lambda f: not str(f[0]).endswith("/online"))
    failed: Dict[str, str] = {}
    for _ in range(2):
        failed = {}
        for rel, value in files:
            if fs.read_attr(root, rel) != value:
                try:
                    fs.write_attr(root, rel, value)
                except OSError as exc:
                    failed[rel] = str(exc.strerror or exc)
    for rel, why in failed.items():
        say(f"restoring {os.path.join(root, rel)} failed: {why}")
    if record.get("nvml") is not None:
        try:
            nvml.restore(record["nvml"], bool(record.get("nvml_locked")))
        except Exception as exc:  # noqa: BLE001 - said, never raised: the job's result stands
            say(f"restoring the GPU's NVML settings failed: {exc}")
