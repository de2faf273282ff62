"""A replay of the CUDA caching allocator's rules, for allocation traces recorded on any device.

`torch.cuda.max_memory_reserved` exceeds `max_memory_allocated` because the caching allocator keeps
the segments it took from the driver and hands out parts of them by best fit: a block freed by one
step's transient tensor is split by the next step's differently sized requests, and what is left of
it can be too small for the request that comes after. How much that costs depends on the order and
sizes of the step's allocations, which torch records on any device (fake tensors included); this
module replays such a trace through the allocator's own rules (c10/cuda/CUDACachingAllocator.cpp,
default settings: one stream, no `max_split_size_mb`, no expandable segments) and reports the
peaks both statistics would show.

The rules replayed:

- request sizes round up to 512 bytes; requests up to 1 MiB come from the small pool, the rest
  from the large pool;
- a request takes the smallest free block of its pool that fits (ties: the lowest address);
- a block larger than the request is split when what remains is at least 512 bytes (small pool)
  or more than 1 MiB (large pool); otherwise the request keeps the whole block;
- with no free block that fits, a new segment is taken: 2 MiB for small requests, 20 MiB for
  requests under 10 MiB, else the request rounded up to 2 MiB;
- a freed block merges with free neighbours of its segment; segments are never given back,
  except when a new one would not fit under `capacity`: then wholly free segments are released
  and the request tried again (the allocator's retry after a failed cudaMalloc).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20           # requests up to this size use the small pool
SMALL_BUFFER = 2 << 20         # a small-pool segment
LARGE_BUFFER = 20 << 20        # the segment of a request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    """The size a request of `size` bytes occupies in a block."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment the allocator takes from the driver for a rounded request it cannot place."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass(eq=False)
class Block:
    """A contiguous part of a segment, allocated or free."""

    address: int
    size: int
    small: bool
    segment: int
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


@dataclass
class Stats:
    """The allocator's counters, as `torch.cuda.memory_stats` names them (bytes)."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    out_of_memory: bool = False


@dataclass
class CachingAllocator:
    """The allocator's state: free blocks of each pool in (size, address) order, and the counters."""

    capacity: int | None = None
    stats: Stats = field(default_factory=Stats)
    _free: dict[bool, list[tuple[int, int, Block]]] = field(default_factory=lambda: {True: [], False: []})
    _next_address: int = 0
    _next_segment: int = 0
    _segment_heads: dict[int, Block] = field(default_factory=dict)

    def malloc(self, nbytes: int) -> Block:
        """Hand out a block for a request of `nbytes` bytes."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_free(size, small) or self._new_segment(size, small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(block.address + size, remaining, small, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert_free(rest)
        block.allocated = True
        self.stats.allocated += block.size
        self.stats.peak_allocated = max(self.stats.peak_allocated, self.stats.allocated)
        return block

    def free(self, block: Block) -> None:
        """Return `block` to its pool, merged with its free neighbours."""
        block.allocated = False
        self.stats.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert_free(block)

    def reset_peak(self) -> None:
        """`torch.cuda.reset_peak_memory_stats`: the peaks start again from the current values."""
        self.stats.peak_allocated, self.stats.peak_reserved = self.stats.allocated, self.stats.reserved

    # ---- internals
    def _take_free(self, size: int, small: bool) -> Block | None:
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        return pool.pop(i)[2]

    def _new_segment(self, size: int, small: bool) -> Block:
        nbytes = segment_size(size)
        if self.capacity is not None and self.stats.reserved + nbytes > self.capacity:
            self._release_free_segments()
            if self.stats.reserved + nbytes > self.capacity:
                self.stats.out_of_memory = True
        block = Block(self._next_address, nbytes, small, self._next_segment)
        self._segment_heads[self._next_segment] = block
        self._next_address += nbytes + ROUND_LARGE   # segments never touch
        self._next_segment += 1
        self.stats.reserved += nbytes
        self.stats.segments += 1
        self.stats.peak_reserved = max(self.stats.peak_reserved, self.stats.reserved)
        return block

    def _release_free_segments(self) -> None:
        for segment, head in list(self._segment_heads.items()):
            if not head.allocated and head.prev is None and head.next is None:
                self._remove_free(head)
                del self._segment_heads[segment]
                self.stats.reserved -= head.size
                self.stats.segments -= 1

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block))

    def _remove_free(self, block: Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.size, block.address))
        assert pool[i][2] is block
        pool.pop(i)


def replay(events: Iterable[tuple[Any, ...]], capacity: int | None = None) -> Stats:
    """Replay a trace: `events` is a sequence of ("alloc", id, nbytes), ("free", id) and ("reset",)
    (`reset_peak`) entries, in program order. Returns the counters at the end."""
    allocator = CachingAllocator(capacity=capacity)
    live: dict[int, Block] = {}
    for event in events:
        kind = event[0]
        if kind == "alloc":
            live[event[1]] = allocator.malloc(event[2])
        elif kind == "free":
            block = live.pop(event[1], None)
            if block is not None:
                allocator.free(block)
        elif kind == "reset":
            allocator.reset_peak()
    return allocator.stats
