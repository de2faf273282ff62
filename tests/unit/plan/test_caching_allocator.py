"""The CUDA caching allocator's rules as `recipeforge.plan.caching_allocator` replays them."""

from __future__ import annotations

from recipeforge.plan.caching_allocator import CachingAllocator, replay, round_size, segment_size

MIB = 1 << 20


def test_sizes_round_as_the_allocator_rounds_them():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(512) == 2 * MIB                      # small pool: 2 MiB segments
    assert segment_size(3 * MIB) == 20 * MIB                 # under 10 MiB: a 20 MiB segment
    assert segment_size(10 * MIB + 1) == 12 * MIB            # else rounded up to 2 MiB


def test_a_freed_block_is_reused_by_best_fit_and_split():
    a = CachingAllocator()
    big = a.malloc(100 * MIB)
    a.free(big)
    small = a.malloc(30 * MIB)        # splits the cached 100 MiB segment: no new segment
    assert a.stats.reserved == 100 * MIB and a.stats.segments == 1
    # 70 MiB remain free in the segment, so a 80 MiB request needs a segment of its own
    a.malloc(80 * MIB)
    assert a.stats.reserved == 180 * MIB and a.stats.allocated == 110 * MIB
    a.free(small)                     # merges with its free neighbour: 100 MiB free again
    a.malloc(100 * MIB)
    assert a.stats.reserved == 180 * MIB


def test_best_fit_takes_the_smallest_block_that_fits():
    a = CachingAllocator()
    blocks = [a.malloc(n * MIB) for n in (40, 60, 50)]
    for b in blocks:
        a.free(b)
    got = a.malloc(45 * MIB)
    assert got.size == 45 * MIB and got.segment == blocks[2].segment  # the 50 MiB one, not the 60


def test_a_remainder_of_one_mib_or_less_is_not_split_off():
    a = CachingAllocator()
    b = a.malloc(22 * MIB)
    a.free(b)
    got = a.malloc(21 * MIB)          # 1 MiB would remain: the request keeps the whole block
    assert got.size == 22 * MIB and a.stats.allocated == 22 * MIB
    a.free(got)
    assert a.malloc(20 * MIB).size == 20 * MIB   # 2 MiB remain: split off


def test_idle_blocks_too_small_for_a_request_raise_reserved_above_allocated():
    # a 16-bit logits block freed before a request twice its size: cached, and no use to it
    events = [("alloc", 0, 200 * MIB), ("alloc", 1, 400 * MIB), ("free", 0), ("alloc", 2, 400 * MIB)]
    stats = replay(events)
    assert stats.peak_allocated == 800 * MIB and stats.peak_reserved == 1000 * MIB


def test_wholly_free_segments_are_released_before_running_out():
    events = [("alloc", 0, 300 * MIB), ("free", 0), ("alloc", 1, 500 * MIB)]
    assert replay(events).peak_reserved == 800 * MIB
    capped = replay(events, capacity=600 * MIB)
    assert capped.reserved == 500 * MIB and not capped.out_of_memory
    assert replay(events + [("alloc", 2, 200 * MIB)], capacity=600 * MIB).out_of_memory
