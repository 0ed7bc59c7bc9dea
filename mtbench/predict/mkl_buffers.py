"""MKL's kept product buffers in a CPU job: the traced matrix products replayed on this host's MKL, counted by it."""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from mtbench.device import mkl_memory
from mtbench.device.arena import in_own_arena

# one product as MKL sees it: (batch, rows, inner, columns); batch 0 for a matrix product (mm, addmm), else a
# batched one (bmm, baddbmm). MKL's buffers stop growing with a dimension past a size (measured: docs/prediction.md),
# so a product is replayed with its dimensions capped at CAPS, at or above those sizes: the same buffers, at most
# 2 x 1024 x 1024 x 8192 FLOPs
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
        _KEPT[key] = _replay(mkl, list(dict.fromkeys(steps)), list(dict.fromkeys(measured)) if own_thread else [])
    kept = _KEPT[key]
    if kept is None:
        return None, mkl.why or "MKL did not gather its peak"
    return kept, f"{kept / 2**20:.1f} MiB MKL keeps of its products' buffers (replayed on this host's MKL)"


def _run(products: Sequence[Shape]) -> Dict[str, Any]:
    with torch.no_grad():
        for batch, rows, inner, cols in products:
            if batch:
                torch.bmm(torch.zeros(batch, rows, inner), torch.zeros(batch, inner, cols))
            else:
                torch.mm(torch.zeros(rows, inner), torch.zeros(inner, cols))
    return {}


def _replay(mkl: mkl_memory.MklMemory, steps: List[Shape], measured: List[Shape]) -> Optional[int]:
    """MKL's peak over the replay, less what it held before: the steps' products in one thread, then, while it
    waits, the measured ones in a thread of its own as the job's measured step runs (arena.in_own_arena). A
    product that raises is raised here once both threads are done."""
    mkl.free_buffers()  # what earlier replays or traces left in the pool would serve this one's products
    before = mkl.held() or 0
    mkl.reset()
    stepped, done = threading.Event(), threading.Event()
    failed: List[BaseException] = []

    def job_thread() -> None:
        try:
            _run(steps)
        except BaseException as exc:  # noqa: B902 - raised again in the calling thread
            failed.append(exc)
        finally:
            stepped.set()
        done.wait()  # alive, as a job's main thread is while its training memory is measured

    main = threading.Thread(target=job_thread, name="mtbench-mkl-steps", daemon=True)
    main.start()
    try:
        stepped.wait()
        if failed:
            raise failed.pop()
        if measured:
            in_own_arena(lambda: _run(measured))
        peak = mkl.read()["mem_mkl_bytes"]
    finally:
        done.set()
        main.join()
    mkl.free_buffers()
    return None if peak is None else max(0, int(peak) - before)
