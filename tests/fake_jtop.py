"""A stand-in for jetson-stats' `jtop` module that behaves like the real client (jtop/jtop.py, 4.x).

Copied behaviour: `jtop(interval)` is a Thread; `start()` connects to the service (JtopException with the
service's text when it is not running), takes the first refresh and starts the thread, which refreshes
every `interval` s and then sets a trigger and calls every observer added with `attach` (on its own
thread); `ok()` waits for that trigger (so it blocks until the next refresh, up to interval x 3) and clears
it; `power` is {"rail": {name: {"volt", "curr", "power", "online", ...}}, "tot": {...}} in mW; `stats`
holds "GPU" (load %) among other keys; `close()` stops the thread.
"""
from __future__ import annotations

import threading
import time
import types
from typing import Callable, Dict, Optional

TIMEOUT_GAIN = 3


class JtopException(Exception):
    pass


def make_jtop_module(rails_mw: Optional[Dict[str, float]] = None, gpu_pct: float = 40.0,
                     service_running: bool = True, version: int = 4) -> types.ModuleType:
    """version=3: jetson-stats 3.x's `power`, a tuple (total, {rail: {"cur", "avg"}}) in mW, no `power` key."""
    rails_mw = dict(rails_mw if rails_mw is not None else {"VDD_IN": 7000.0, "VDD_CPU_GPU_CV": 2500.0,
                                                             "VDD_SOC": 1200.0})

    class jtop(threading.Thread):  # noqa: N801 - the real class's name
        instances = []

        def __init__(self, interval: float = 0.5) -> None:
            super().__init__(daemon=True)
            self._interval = float(interval)
            self._trigger = threading.Event()
            self._observers = set()
            self._running = False
            self._stats: dict = {}
            self.refreshes = 0
            self.ok_calls = 0
            jtop.instances.append(self)

        def attach(self, observer: Callable) -> None:
            self._observers.add(observer)

        def detach(self, observer: Callable) -> None:
            self._observers.discard(observer)

        def _decode(self) -> None:
            rail = {name: {"online": True, "volt": 5000, "curr": int(mw / 5), "power": int(mw), "avg": int(mw),
                           "warn": 0, "crit": 0} for name, mw in rails_mw.items()}
            if version == 3:
                rail = {name: {"cur": int(mw), "avg": int(mw)} for name, mw in rails_mw.items()}
            self._stats = {"power": {"rail": rail, "tot": {"power": int(sum(rails_mw.values()))}},
                           "gpu": gpu_pct}
            self.refreshes += 1
            self._trigger.set()
            for observer in list(self._observers):
                observer(self)

        def start(self) -> None:
            if not service_running:
                raise JtopException("The jtop.service is not active. Please run:\n"
                                    "sudo systemctl restart jtop.service")
            time.sleep(0.01)  # the handshake with the service
            self._decode()  # the first refresh, before start() returns
            self._running = True
            super().start()

        def run(self) -> None:
            while self._running:
                time.sleep(self._interval)  # the service pushes one refresh per interval
                if self._running:
                    self._decode()

        def ok(self, spin: bool = False) -> bool:
            self.ok_calls += 1
            if not spin and not self._trigger.is_set():
                if not self._trigger.wait(self._interval * TIMEOUT_GAIN):
                    self._running = False
            if self._running:
                self._trigger.clear()
            return self._running

        @property
        def power(self):
            if version == 3:
                tot = self._stats["power"]["tot"]["power"]
                return {"cur": tot, "avg": tot}, self._stats["power"]["rail"]
            return self._stats["power"]

        @property
        def stats(self) -> dict:
            return {"time": time.time(), "GPU": self._stats["gpu"], "RAM": 0.3,
                    "Power TOT": self._stats["power"]["tot"]["power"]}

        @property
        def interval(self) -> float:
            return self._interval

        def close(self) -> None:
            self._running = False

    module = types.ModuleType("jtop")
    module.jtop, module.JtopException = jtop, JtopException
    return module
