"""A blocking exclusive file lock (flock) for short critical sections, e.g. building one entry of the
tokenized-data cache while other processes wait for it. The run directory's lock, which records its
holder and survives a crashed holder, is `recipeforge.outputs.run_lock`."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

# flock not offered by this filesystem (some network mounts): callers fall back to atomic renames.
UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold a blocking exclusive lock on the file `path` (created if missing) for the `with` block.
    Where the filesystem has no flock, the block runs unlocked (its writes are atomic renames anyway)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in UNSUPPORTED:
                raise
        yield
    finally:
        os.close(fd)
