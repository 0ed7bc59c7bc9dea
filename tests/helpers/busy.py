"""A child that spins for a known share of every 10 ms and reports the CPU time it got: the truth CPU figures meet."""
from __future__ import annotations

import subprocess
import sys

# For `seconds`, spins for `duty` of every 10 ms slice and sleeps the rest, then prints the monotonic start and end
# of that loop and the CPU time it got in between (the truth, from its own clock: on a loaded machine a spinning
# process is not on a core all the time it spins). Ungated it prints "go" and starts at once; gated it starts at a
# line on its stdin and exits at a second one.
DUTY = """
import sys, time
duty, seconds, gated = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "gated"
if gated:
    sys.stdin.readline()
else:
    print("go", flush=True)
start = time.monotonic(); cpu0 = time.process_time()
while time.monotonic() - start < seconds:
    t = time.monotonic()
    while time.monotonic() - t < 0.010 * duty:
        pass
    if duty < 1:
        time.sleep(0.010 * (1 - duty))
print(start, time.monotonic(), time.process_time() - cpu0, flush=True)
if gated:
    sys.stdin.readline()
"""


def start_duty(duty: float, seconds: float, gated: bool = False) -> "subprocess.Popen[str]":
    """The DUTY child, its stdout (and, gated, its stdin) a pipe of text lines."""
    return subprocess.Popen([sys.executable, "-c", DUTY, str(duty), str(seconds), "gated" if gated else "now"],
                            stdin=subprocess.PIPE if gated else None, stdout=subprocess.PIPE, text=True)
