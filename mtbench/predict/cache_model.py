"""The trace's model of the last-level cache: what an op reads or writes there is not DRAM traffic."""
from __future__ import annotations

import collections
import weakref
from typing import Any


def cached_outputs(out: Any, capacity: int) -> int:
    """Bytes of an op's output tensors that each fit in a last-level cache of `capacity` bytes: a matrix product
    writes such an output into the cache, where the op that consumes it reads it, so it is not the product's DRAM
    traffic (held out of the accuracy benchmark's calibration, seq2seq's per-position products at batch 2 were
    predicted 41 % slow with their outputs counted, 5 % fast without; docs/benchmarks.md)."""
    import torch

    if capacity <= 0:
        return 0
    sizes = [t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return sum(n for n in sizes if n <= capacity)


class RecentReads:
    """The tensors the step's ops touched last, up to `capacity` bytes (least recently used out first): a model of
    the cache a tensor read again soon is served from. A tensor is its storage, offset and size (a weight and its
    transpose are one; two rows of one batch are two), and a hit needs the same storage alive: a freed storage's
    address, which the next allocation may take, is not a hit."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.size = capacity, 0
        self.held: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()  # key -> (bytes, weakref)

    def touch(self, tensors: Any) -> int:
        """Bytes of `tensors` found in the cache; all of them are then its most recent. A tensor twice among them
        (an in-place op's input and output) is a hit only where an earlier call left it: an op's write of what it
        has just read is still traffic where that tensor was not held (its line is written back)."""
        if self.capacity <= 0:  # no cache: nothing is held, nothing is a hit
            return 0
        import torch

        hit, seen = 0, set()
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                storage = t.untyped_storage()
                key, nbytes = (storage._cdata, t.storage_offset(), t.numel()), t.numel() * t.element_size()
                ref = weakref.ref(storage)
            except (RuntimeError, NotImplementedError, TypeError):  # no single storage (sparse, nested): no hit
                continue
            if key in seen:
                continue
            seen.add(key)
            old = self.held.pop(key, None)
            if old is not None:
                self.size -= old[0]
                hit += nbytes if old[1]() is storage else 0
            self.held[key] = (nbytes, ref)
            self.size += nbytes
            while self.size > self.capacity and self.held:
                self.size -= self.held.popitem(last=False)[1][0]
        return hit
