"""Exact deduplication of training rows: a row identical to an earlier one (in every column the
format reads) is dropped. Identity is a hash of the row's canonical JSON, so key order and the
file type the row came from do not matter."""

from __future__ import annotations

import hashlib
import json

SKIP = ("_row", "_format")  # bookkeeping columns, different for every row


def row_digest(row: dict) -> bytes:
    """A digest of a row's content (bookkeeping columns left out)."""
    content = {k: v for k, v in row.items() if k not in SKIP}
    return hashlib.blake2b(json.dumps(content, sort_keys=True, ensure_ascii=False, default=str).encode(),
                           digest_size=16).digest()


def drop_duplicates(ds, seen: set[bytes]) -> tuple[object, int]:
    """`ds` without the rows whose digest is in `seen` or repeats an earlier row; `seen` is updated
    (share one set between datasets to deduplicate across them). Returns (dataset, rows dropped)."""
    keep = []
    columns = [c for c in ds.column_names if c not in SKIP]
    i = 0
    for batch in ds.select_columns(columns).iter(batch_size=1000):  # column batches: far fewer Arrow reads
        for values in zip(*(batch[c] for c in columns)):
            digest = row_digest(dict(zip(columns, values)))
            if digest not in seen:
                seen.add(digest)
                keep.append(i)
            i += 1
    dropped = len(ds) - len(keep)
    return (ds.select(keep) if dropped else ds), dropped
