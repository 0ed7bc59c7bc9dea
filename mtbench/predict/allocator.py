"""Replay a step's allocations through a model of PyTorch's CUDA caching allocator: allocated and reserved peaks."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

# Constants of c10/cuda/CUDACachingAllocator.cpp (unchanged from torch 1.x to 2.x)
MIN_BLOCK_BYTES = 512  # every request is rounded up to a multiple of 512 bytes
SMALL_SIZE_BYTES = 1 << 20  # requests up to 1 MiB come from the small pool
SMALL_BUFFER_BYTES = 2 << 20  # small-pool segments are 2 MiB
LARGE_BUFFER_BYTES = 20 << 20  # requests of 1-10 MiB get a 20 MiB segment
MIN_LARGE_ALLOC_BYTES = 10 << 20  # requests from 10 MiB get a segment of their own size ...
ROUND_LARGE_BYTES = 2 << 20  # ... rounded up to 2 MiB


def round_request(nbytes: int) -> int:
    """The block size the allocator hands out for a request of `nbytes` (what max_memory_allocated counts)."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(block_bytes: int) -> int:
    """The cudaMalloc size of a new segment for a block that no cached segment can hold."""
    if block_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if block_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-block_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


@dataclass
class AllocatorPeaks:
    allocated_bytes: int  # peak of allocated blocks (torch.cuda.max_memory_allocated)
    reserved_bytes: int  # peak of cudaMalloc'ed segments (torch.cuda.max_memory_reserved)
    breakdown_bytes: Dict[str, int]  # allocated bytes by kind at the allocated peak
    segments: int  # segments at the end


class _Pool:
    """Free blocks of one pool, best fit by (size, segment, offset); a split leaves the rest free."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: List[Tuple[int, int, int]] = []  # sorted (size, segment id, offset)

    def take(self, size: int) -> Tuple[int, int, int]:
        i = bisect.bisect_left(self.free, (size, -1, -1))
        if i == len(self.free):
            return (-1, -1, -1)
        return self.free.pop(i)

    def put(self, block: Tuple[int, int, int]) -> None:
        bisect.insort(self.free, block)

    def remove(self, block: Tuple[int, int, int]) -> None:
        i = bisect.bisect_left(self.free, block)
        if i < len(self.free) and self.free[i] == block:
            self.free.pop(i)


class CachingAllocatorModel:
    """Blocks carved from segments, best-fit reuse, splitting and merging of neighbours, no release
    (the runner never empties the cache between steps). Streams, expandable segments and garbage
    collection thresholds are not modelled."""

    def __init__(self) -> None:
        self.pools = (_Pool(True), _Pool(False))
        self.segment_sizes: List[int] = []
        # per segment: offset -> (size, free); kept to merge a freed block with free neighbours
        self.blocks: List[Dict[int, Tuple[int, bool]]] = []
        self.allocated = 0
        self.reserved = 0

    def malloc(self, nbytes: int) -> Tuple[int, int, int]:
        size = round_request(nbytes)
        small = size <= SMALL_SIZE_BYTES
        pool = self.pools[0 if small else 1]
        size_b, seg, off = pool.take(size)
        if seg < 0:
            seg_bytes = segment_size(size)
            seg = len(self.segment_sizes)
            self.segment_sizes.append(seg_bytes)
            self.blocks.append({0: (seg_bytes, True)})
            self.reserved += seg_bytes
            size_b, off = seg_bytes, 0
        rest = size_b - size
        # the allocator splits a small block if >= 512 bytes remain, a large one if > 1 MiB remains
        if (small and rest >= MIN_BLOCK_BYTES) or (not small and rest > SMALL_SIZE_BYTES):
            self.blocks[seg][off + size] = (rest, True)
            pool.put((rest, seg, off + size))
        else:
            size = size_b
        self.blocks[seg][off] = (size, False)
        self.allocated += size
        return (seg, off, size)

    def free(self, handle: Tuple[int, int, int]) -> None:
        seg, off, size = handle
        pool = self.pools[0 if self.segment_sizes[seg] == SMALL_BUFFER_BYTES else 1]
        blocks = self.blocks[seg]
        self.allocated -= size
        # merge with the free block after and the free block before
        nxt = off + size
        if nxt in blocks and blocks[nxt][1]:
            nsize = blocks.pop(nxt)[0]
            pool.remove((nsize, seg, nxt))
            size += nsize
        prev = next((o for o, (s, f) in blocks.items() if f and o + s == off), None)
        blocks.pop(off)
        if prev is not None:
            psize = blocks[prev][0]
            pool.remove((psize, seg, prev))
            off, size = prev, size + psize
        blocks[off] = (size, True)
        pool.put((size, seg, off))


def replay(events: Iterable[Tuple[int, int, str]]) -> AllocatorPeaks:
    """Replay (storage id, bytes or -1 freed or -2 kind changed, kind) events; peaks of the allocator model."""
    model = CachingAllocatorModel()
    live: Dict[int, Tuple[Tuple[int, int, int], str]] = {}
    by_kind: Dict[str, int] = {}
    peak_alloc = peak_reserved = 0
    peak_kinds: Dict[str, int] = {}
    for key, nbytes, kind in events:
        if nbytes == -2:  # the same block, another kind
            if key in live:
                handle, old = live[key]
                by_kind[old] -= handle[2]
                by_kind[kind] = by_kind.get(kind, 0) + handle[2]
                live[key] = (handle, kind)
            continue
        if nbytes < 0:
            if key in live:
                handle, old = live.pop(key)
                by_kind[old] -= handle[2]
                model.free(handle)
            continue
        if nbytes == 0:
            continue
        handle = model.malloc(nbytes)
        live[key] = (handle, kind)
        by_kind[kind] = by_kind.get(kind, 0) + handle[2]
        if model.allocated > peak_alloc:
            peak_alloc = model.allocated
            peak_kinds = dict(by_kind)
        peak_reserved = max(peak_reserved, model.reserved)
    return AllocatorPeaks(peak_alloc, peak_reserved, peak_kinds, len(model.segment_sizes))
