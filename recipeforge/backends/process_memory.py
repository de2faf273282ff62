"""What a process holds in memory, measured: its anonymous resident size once the C allocator has handed free
memory back. The sharded loaders record it (`sharded_loading/rank<N>.json`) to show no process held the whole
base."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import ctypes


def released_rss_bytes() -> int:
    """This process's anonymous resident memory (`_rss_bytes`) once the C allocator has handed its
    free memory back.

    Reading a checkpoint tensor by tensor frees many large temporaries; glibc keeps such freed
    memory in its heaps (its mmap threshold grows with every large free), so the resident size
    climbs far above what is alive (several times the shard, measured). `malloc_trim` returns it,
    which keeps the resident size of a long load near its live bytes, and makes the figure a
    measure of what is held. Elsewhere than glibc: the resident size as it is."""
    _malloc_trim()
    return _rss_bytes()


def _malloc_trim() -> None:
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018  (raises where the C library has none)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: ctypes.CDLL | Literal[False] | None = None


def _rss_bytes() -> int:
    """This process's anonymous resident memory now: resident minus file-backed pages (Linux; 0
    where /proc is missing). Pages of a memory-mapped checkpoint count as resident while mapped but
    are the page cache's, which the kernel drops under pressure; what a load really costs is the
    anonymous part."""
    import os

    try:
        _, resident, shared = (int(v) for v in Path("/proc/self/statm").read_text().split()[:3])
    except (OSError, ValueError):
        return 0
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE")
