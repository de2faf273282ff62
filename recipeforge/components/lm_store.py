"""Tokenized samples kept on disk while they are made: Arrow files written chunk by chunk and read back
memory-mapped, so preparing a corpus holds one chunk of tokens in memory, not the corpus.

`SampleFile` receives the tokenizer's chunks as they come (`lm_encode.encode_dataset`'s `sink`);
`pack_to_disk` packs a tokenized dataset bin chunk by bin chunk into another such file, with exactly
the bins, order, labels and positions of `packing.pack_flat` (which holds every token at once and
stays the reference the tests compare with). Only per-sample numbers (lengths: 8 bytes a sample) and
the bins are held whole.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.components.packing import IGNORE, PackStats, best_fit_decreasing

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

BATCH_ROWS = 16_384   # samples per read when counting over a dataset
PACK_BINS = 4_096     # packed sequences written per chunk


class SampleFile:
    """An Arrow file of list<int32> token columns, appended table by table, then memory-mapped."""

    def __init__(self, path: Path):
        from datasets.arrow_writer import ArrowWriter

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = ArrowWriter(path=str(self.path))
        self._schema = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        """Append `table` (the same columns every time)."""
        if self._schema is None:
            self._schema = table.schema
        if table.num_rows:
            self._writer.write_table(table)
            self.rows += table.num_rows

    def dataset(self, fingerprint: str) -> Any:
        """The written samples as a memory-mapped `datasets.Dataset` (an empty in-memory one if none)."""
        import datasets
        import pyarrow as pa
        from datasets.table import MemoryMappedTable

        if self.rows == 0:
            self._writer.close()
            schema = self._schema or pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])
            return datasets.Dataset(schema.empty_table(), fingerprint=fingerprint)
        self._writer.finalize()
        self._writer.close()
        return datasets.Dataset(MemoryMappedTable.from_file(str(self.path)), fingerprint=fingerprint)


def _batches(ds, columns: list[str]):
    """`ds`'s `columns` as Arrow tables of at most `BATCH_ROWS` rows, in row order (its index mapping applied)."""
    arrow = ds.select_columns(columns).with_format("arrow")
    for start in range(0, len(ds), BATCH_ROWS):
        yield arrow[start:start + BATCH_ROWS]


def _flat(column: pa.ChunkedArray) -> np.ndarray:
    """The values of a list<int32> column, end to end, as a writable numpy int32 array."""
    import numpy as np

    parts = [c.flatten().to_numpy(zero_copy_only=False) for c in column.chunks]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


def row_lengths(ds) -> Any:
    """Tokens per sample of a tokenized dataset (np.int64), read batch by batch."""
    import numpy as np
    import pyarrow.compute as pc

    parts = [pc.list_value_length(c).to_numpy(zero_copy_only=False)
             for table in _batches(ds, ["input_ids"]) for c in table.column("input_ids").chunks]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def trained_tokens(ds) -> int:
    """Tokens that carry a label (not IGNORE) in a tokenized dataset, counted batch by batch."""
    return sum(int((_flat(table.column("labels")) != IGNORE).sum()) for table in _batches(ds, ["labels"]))


def pack_to_disk(ds, capacity: int, out: SampleFile, lengths=None) -> tuple[PackStats, int]:
    """Pack the samples of `ds` into sequences of at most `capacity` tokens, written to `out` a chunk of
    bins at a time: the bins of `best_fit_decreasing`, each bin's samples in row order, the first label
    of every sample IGNORE (nothing before it in the sequence predicts it), positions restarting at
    each sample. Returns the packing stats and the samples' trained tokens (counted before packing)."""
    import numpy as np

    from recipeforge.components.lm_encode import to_arrow

    lengths = row_lengths(ds) if lengths is None else lengths
    bins = best_fit_decreasing(lengths.tolist(), capacity)
    trained = 0
    for start in range(0, len(bins), PACK_BINS):
        chunk = bins[start:start + PACK_BINS]
        rows = np.fromiter(itertools.chain.from_iterable(sorted(b) for b in chunk), dtype=np.int64)
        table = ds.select(rows).select_columns(["input_ids", "labels"]).with_format("arrow")[:]
        ids, labels = _flat(table.column("input_ids")), _flat(table.column("labels"))
        trained += int((labels != IGNORE).sum())
        sample_len = lengths[rows]
        first = np.cumsum(sample_len) - sample_len  # where each sample begins in this chunk's output
        labels[first[sample_len > 0]] = IGNORE
        positions = (np.arange(len(ids), dtype=np.int64) - np.repeat(first, sample_len)).astype(np.int32)
        per_bin = np.fromiter((int(lengths[b].sum()) for b in chunk), dtype=np.int64, count=len(chunk))
        out.write(to_arrow({"input_ids": ids, "labels": labels, "position_ids": positions}, per_bin))
    stats = PackStats(samples=len(lengths), sequences=len(bins), tokens=int(lengths.sum()), capacity=capacity)
    return stats, trained
