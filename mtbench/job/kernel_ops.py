"""The profiler's GPU kernels joined to the operations that launched them, through their correlation ids.

A kernel (and a GPU memcpy or memset) in torch.profiler's Chrome trace carries `args.correlation`; the CUDA runtime
call that launched it (`cudaLaunchKernel`, `cudaMemcpyAsync`, ... in category `cuda_runtime` or `cuda_driver`)
carries the same id and runs on the host thread, inside the op that called it. A kernel's owner is the top-level
host op of that thread whose interval holds the launch: the same ops ops.csv's host rows name, so a row's GPU time
(and energy, where the power source resolves it) is that of the kernels its op launched.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")

Thread = Tuple[Any, Any]  # (pid, tid)
TopOp = Tuple[float, float, str]  # (start us, end us, name)


def top_ops(host: Sequence[dict]) -> Dict[Thread, List[TopOp]]:
    """Per thread, its host events not nested in another of the same thread, in time order (`host`: the events
    ops.csv counts: complete events of the host categories, marks already left out)."""
    out: Dict[Thread, List[TopOp]] = defaultdict(list)
    open_end: Dict[Thread, float] = {}
    # repr: pids and tids are numbers or strings; only the order within a thread matters
    for e in sorted(host, key=lambda e: (repr(e.get("pid")), repr(e["tid"]), e["ts"], -e.get("dur", 0))):
        thread = (e.get("pid"), e["tid"])
        if e["ts"] < open_end.get(thread, -1.0):
            continue  # inside a top-level op of this thread
        open_end[thread] = e["ts"] + e.get("dur", 0)
        out[thread].append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    return out


def owners(events: Sequence[dict], tops: Dict[Thread, List[TopOp]]) -> Dict[Any, Optional[str]]:
    """correlation id -> the name of the top-level op that launched it (None: the launch is outside every op,
    e.g. in Python between two ops)."""
    starts = {thread: [op[0] for op in ops] for thread, ops in tops.items()}
    out: Dict[Any, Optional[str]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in RUNTIME_CATS:
            continue
        correlation = (e.get("args") or {}).get("correlation")
        if correlation is None:
            continue
        thread = (e.get("pid"), e["tid"])
        ops = tops.get(thread, [])
        i = bisect.bisect_right(starts.get(thread, []), e["ts"]) - 1
        out[correlation] = ops[i][2] if i >= 0 and ops[i][1] >= e["ts"] else None
    return out


def device_events(events: Sequence[dict], tops: Dict[Thread, List[TopOp]]) -> Tuple[List[Tuple[dict, str]], List[list]]:
    """([(kernel event, the name its ops.csv row takes)], kernels.csv rows [kernel, op, calls, total_s]).

    A kernel's row is its launching op's name; one whose launch the trace lacks (no runtime event with its
    correlation id) or that was launched outside every op keeps its own name, and kernels.csv says which."""
    owner = owners(events, tops)
    named: List[Tuple[dict, str]] = []
    table: Dict[Tuple[str, str], List[float]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        correlation = (e.get("args") or {}).get("correlation")
        op = owner.get(correlation) if correlation is not None else None
        if op is None:
            why = "[launch not in the trace]" if correlation not in owner else "[launched outside any op]"
        named.append((e, op if op is not None else e["name"]))
        acc = table.setdefault((e["name"], op if op is not None else why), [0, 0.0])
        acc[0] += 1
        acc[1] += e.get("dur", 0) / 1e6
    rows = [[kernel, op, int(calls), total] for (kernel, op), (calls, total) in table.items()]
    rows.sort(key=lambda r: -r[3])
    return named, rows


KERNELS_HEADER = ["kernel", "op", "calls", "total_s"]
