"""MKL's kept product buffers in a CPU job: the traced matrix products replayed on this host's MKL, counted by it."""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from mtbench.device import mkl_memory

# one product as MKL sees it: (batch, rows, inner, columns); batch 0 for a matrix product (mm, addmm), else a
# batched one (bmm, baddbmm). MKL's buffers stop growing with a dimension past a size (this project's VM, MKL 2024.2,
# AVX-512: rows 1024, inner 384, columns 8192, a batch of 2; docs/prediction.md), so a product is replayed with its
# dimensions capped there: the same buffers, at most 2 x 1024 x 1024 x 8192 FLOPs
Shape = Tuple[int, int, int, int]
CAPS = (2, 1024, 1024, 8192)
_OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def note(products: List[Shape], func: Any, args: Tuple[Any, ...]) -> None:
    """Add the product `func` runs on `args` to `products` where MKL runs it (float32 on a CPU), capped."""
    where = _OPERANDS.get(func._schema.name)
    if where is None or len(args) <= where[1]:
        return
    a, b = args[where[0]], args[where[1]]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.device.type != "cpu" \
            or a.dtype != torch.float32 or a.dim() != b.dim() or a.dim() not in (2, 3):
        return
    batch = min(int(a.shape[0]), CAPS[0]) if a.dim() == 3 else 0
    products.append((batch, min(int(a.shape[-2]), CAPS[1]), min(int(a.shape[-1]), CAPS[2]),
                     min(int(b.shape[-1]), CAPS[3])))


_KEPT: Dict[Tuple[Any, ...], Optional[int]] = {}  # deterministic on one host and thread count: each run once


def kept_bytes(steps: Sequence[Shape], measured: Sequence[Shape], own_thread: bool) -> Tuple[Optional[int], str]:
    """The most MKL's memory manager holds in a job whose steps run the products `steps` (in order) and whose
    training memory is measured on a step that runs `measured`: in a thread of its own (own_thread: a CPU job
    without a budget, device/peak.measure_training_step; its OpenMP team makes buffers of its own while the steps'
    are kept), else in the steps' thread (nothing new). Replayed here, each product once (MKL serves a repeat from
    the buffers it kept), in a thread that stays alive while the measured products run, as a job's main thread
    does; (None, why) where MKL's statistics cannot be read."""
    mkl = mkl_memory.process()
    if mkl.held() is None:
        return None, mkl.why or "MKL's statistics cannot be read"
    key = (tuple(steps), tuple(measured) if own_thread else (), own_thread, torch.get_num_threads())
    if key not in _KEPT:
        _KEPT[key] = _replay(mkl, _once(steps), _once(measured) if own_thread else [])
    kept = _KEPT[key]
    if kept is None:
        return None, mkl.why or "MKL did not gather its peak"
    return kept, f"{kept / 2**20:.1f} MiB MKL keeps of its products' buffers (replayed on this host's MKL)"


def _once(products: Sequence[Shape]) -> List[Shape]:
    seen: Dict[Shape, None] = {}
    for p in products:
        seen.setdefault(p, None)
    return list(seen)


def _run(products: Sequence[Shape]) -> None:
    with torch.no_grad():
        for batch, rows, inner, cols in products:
            if batch:
                torch.bmm(torch.zeros(batch, rows, inner), torch.zeros(batch, inner, cols))
            else:
                torch.mm(torch.zeros(rows, inner), torch.zeros(inner, cols))


def _replay(mkl: mkl_memory.MklMemory, steps: List[Shape], measured: List[Shape]) -> Optional[int]:
    """MKL's peak over the replay, less what it held before: the steps' products in one thread, then, while it
    waits, the measured ones in another."""
    mkl.free_buffers()  # what earlier replays or traces left in the pool would serve this one's products
    before = mkl.held() or 0
    mkl.reset()
    stepped, done = threading.Event(), threading.Event()

    def job_thread() -> None:
        _run(steps)
        stepped.set()
        done.wait()  # alive, as a job's main thread is while its training memory is measured

    def measure_thread() -> None:
        _run(measured)

    main = threading.Thread(target=job_thread, name="mtbench-mkl-steps")
    main.start()
    stepped.wait()
    if measured:
        other = threading.Thread(target=measure_thread, name="mtbench-mkl-measured")
        other.start()
        other.join()
    peak = mkl.read()["mem_mkl_bytes"]
    done.set()
    main.join()
    mkl.free_buffers()
    return None if peak is None else max(0, int(peak) - before)

