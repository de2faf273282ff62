"""The shared data step's token rows, written in the formats Megatron reads (numpy and pyarrow only).

The Megatron backend trains on exactly the rows the Hugging Face stages train on: the tokenized,
masked and (optionally) packed output of `components.lm_data`. Nothing is decoded back to text and
nothing is tokenized again. Each split is written twice:

* ``<split>.idx.parquet`` -- the packed-row format of Megatron-Bridge's ``GPTSFTPackedParquetDataset``
  (``megatron/bridge/data/packing/parquet.py``, v0.6): one row per training row with ``input_ids``,
  ``seq_start_id`` (where each packed sample starts) and ``loss_mask``. Megatron-Bridge's packing
  stores the mask *rolled by one* (``fill_packing_strategy``: ``loss_mask[j]`` says whether token
  ``j+1`` is a target), and its collate function cuts every sample into ``tokens = ids[s:e-1]``,
  ``labels = ids[s+1:e]``, ``loss_mask[s:e-1]``. This is what the Megatron stage trains on
  (`GPTSFTDatasetConfig` with offline packing pointing at these files).
* ``<split>_text_document.bin/.idx`` -- megatron-core's indexed dataset (``MMIDIDX`` layout of
  ``megatron/core/datasets/indexed_dataset.py``): one document per training row, one sequence per
  sample in it, so the token ids and sample boundaries can be read by megatron-core tools.

`read_packed_parquet`, `read_indexed_dataset` and `megatron_targets` read them back the way
Megatron does, for tests and for inspecting a run.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

IGNORE = -100
INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron.core.datasets.indexed_dataset.DType: numpy dtype name -> code written in the .idx header
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def token_dtype(vocab_size: int | None) -> type:
    """The token dtype megatron-core picks for a vocabulary (`DType.optimal_dtype`)."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


# ---------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class PackedRow:
    """One training row as Megatron-Bridge's packed dataset stores it."""

    input_ids: list[int]
    seq_start_id: list[int]   # start offset of every sample in the row (first is 0)
    loss_mask: list[int]      # rolled by one: loss_mask[j] == 1 when token j+1 is a target


def sample_starts(row: dict) -> list[int]:
    """Where each sample of an HF-path row starts: packed rows restart their position ids at every
    sample (`components.packing`), unpacked rows are one sample."""
    pos = row.get("position_ids")
    if pos is None:
        return [0]
    return [i for i, p in enumerate(pos) if i == 0 or p != pos[i - 1] + 1]


def to_packed_row(row: dict) -> PackedRow:
    """An HF-path row (`input_ids`, `labels` with -100 masks, maybe `position_ids`) as a packed row.

    HF's loss predicts token j from the tokens before it when ``labels[j] != -100``; Megatron's
    predicts token j+1 from position j when ``loss_mask[j]`` is set. A sample's first token is
    never a target (nothing of its own sample precedes it), so the masks are the same set of
    predictions."""
    ids = [int(t) for t in row["input_ids"]]
    labels = row["labels"]
    starts = sample_starts(row)
    first = set(starts)
    mask = [0] * len(ids)
    for j in range(len(ids) - 1):
        mask[j] = int(labels[j + 1] != IGNORE and (j + 1) not in first)
    return PackedRow(ids, starts, mask)


def megatron_targets(row: PackedRow, eos_id: int | None) -> list[tuple[int, int]]:
    """The (position, target token) pairs Megatron-Bridge's packed collate function trains on for
    `row`, positions counted in the packed row: per sample [s, e) the inputs are ids[s:e-1], the
    targets ids[s+1:e], the mask loss_mask[s:e-1]; positions whose input token is EOS are dropped
    (``loss_mask[tokens == eos_id] = 0`` in ``GPTSFTPackedDataset.collate_fn``; `eos_id` None: the
    stored mask alone)."""
    ids, bounds = row.input_ids, list(row.seq_start_id) + [len(row.input_ids)]
    out = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        for j in range(s, e - 1):
            if row.loss_mask[j] and ids[j] != eos_id:
                out.append((j, ids[j + 1]))
    return out


def hf_targets(row: dict) -> list[tuple[int, int]]:
    """The (position, target token) pairs the HF path trains on for `row`: position j-1 predicts
    token j wherever ``labels[j] != -100`` (the model shifts labels by one); a packed sample's first
    label is already -100 (`components.packing`)."""
    labels = row["labels"]
    return [(j - 1, int(labels[j])) for j in range(1, len(labels)) if labels[j] != IGNORE]


# ---------------------------------------------------------------------------------- parquet


def write_packed_parquet(path: Path, rows: Iterable[PackedRow], *, row_group_size: int = 500) -> int:
    """Write rows in the schema of Megatron-Bridge's ``write_packed_parquet`` (input_ids, loss_mask as
    int8, seq_start_id); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    table = pa.table({
        "input_ids": pa.array([r.input_ids for r in rows], type=pa.list_(pa.int32())),
        "loss_mask": pa.array([r.loss_mask for r in rows], type=pa.list_(pa.int8())),
        "seq_start_id": pa.array([r.seq_start_id for r in rows], type=pa.list_(pa.int32())),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, str(tmp), row_group_size=row_group_size)
    tmp.replace(path)
    return len(rows)


def read_packed_parquet(path: Path) -> list[PackedRow]:
    """Rows of a packed parquet file, as the dataset class reads them."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(path), columns=["input_ids", "seq_start_id", "loss_mask"])
    cols = {name: table.column(name).to_pylist() for name in ("input_ids", "seq_start_id", "loss_mask")}
    return [PackedRow(i, s, m) for i, s, m in zip(cols["input_ids"], cols["seq_start_id"], cols["loss_mask"])]


def pack_metadata(rows: Sequence[PackedRow]) -> dict:
    """The per-file entry of Megatron-Bridge's packing metadata JSON (read only when cu_seqlens are
    padded for CUDA graphs; written so the dataset's metadata path always resolves)."""
    lengths = [e - s for r in rows for s, e in zip(r.seq_start_id, list(r.seq_start_id[1:]) + [len(r.input_ids)])]
    return {"max_samples_per_bin": max((len(r.seq_start_id) for r in rows), default=0),
            "dataset_max_seqlen": max(lengths, default=0),
            "min_packed_seqlen": min((len(r.input_ids) for r in rows), default=0)}


# ---------------------------------------------------------------------------------- indexed dataset


def write_indexed_dataset(prefix: Path, documents: Iterable[tuple[Sequence[int], Sequence[int]]],
                          dtype: type = np.int32) -> tuple[int, int]:
    """Write ``prefix.bin`` / ``prefix.idx`` in megatron-core's indexed-dataset layout.

    `documents` yields (token ids, sequence lengths) per document, the lengths summing to the ids.
    The .idx is: header ``MMIDIDX\\0\\0``, version (<Q, 1), dtype code (<B), sequence count (<Q),
    document count (<Q, sequences' end indices including the leading 0), then int32 sequence
    lengths, int64 byte pointers and int64 document indices. Returns (sequences, documents)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lengths: list[int] = []
    doc_index = [0]
    with open(f"{prefix}.bin", "wb") as bin_file:
        for ids, seq_lengths in documents:
            arr = np.asarray(ids, dtype=dtype)
            if sum(seq_lengths) != arr.size:
                raise ValueError(f"sequence lengths {list(seq_lengths)} do not add up to {arr.size} tokens")
            bin_file.write(arr.tobytes(order="C"))
            lengths.extend(int(n) for n in seq_lengths)
            doc_index.append(len(lengths))
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if lengths:
        pointers[1:] = np.cumsum(np.asarray(lengths[:-1], dtype=np.int64) * itemsize)
    with open(f"{prefix}.idx", "wb") as idx:
        idx.write(INDEX_HEADER)
        idx.write(struct.pack("<Q", INDEX_VERSION))
        idx.write(struct.pack("<B", DTYPE_CODES[np.dtype(dtype).name]))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(doc_index)))
        idx.write(np.asarray(lengths, dtype=np.int32).tobytes(order="C"))
        idx.write(pointers.tobytes(order="C"))
        idx.write(np.asarray(doc_index, dtype=np.int64).tobytes(order="C"))
    return len(lengths), len(doc_index) - 1


@dataclass(frozen=True)
class IndexedDataset:
    """An indexed dataset read back: sequences (as numpy views of the .bin) and document indices."""

    dtype: type
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray
    data: np.ndarray

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.sequence_pointers[i]) // np.dtype(self.dtype).itemsize
        return self.data[start:start + int(self.sequence_lengths[i])]

    def document(self, d: int) -> list[np.ndarray]:
        """The sequences of document `d`."""
        return [self[i] for i in range(int(self.document_indices[d]), int(self.document_indices[d + 1]))]


def read_indexed_dataset(prefix: Path) -> IndexedDataset:
    """Read ``prefix.idx`` / ``prefix.bin`` as megatron-core's `_IndexReader` does."""
    raw = Path(f"{prefix}.idx").read_bytes()
    if raw[:9] != INDEX_HEADER:
        raise ValueError(f"{prefix}.idx: bad header {raw[:9]!r}")
    (version,) = struct.unpack_from("<Q", raw, 9)
    if version != INDEX_VERSION:
        raise ValueError(f"{prefix}.idx: unknown version {version}")
    (code,) = struct.unpack_from("<B", raw, 17)
    names = {v: k for k, v in DTYPE_CODES.items()}
    dtype = getattr(np, names[code])
    seq_count, doc_count = struct.unpack_from("<QQ", raw, 18)
    offset = 34
    lengths = np.frombuffer(raw, dtype=np.int32, count=seq_count, offset=offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(raw, dtype=np.int64, count=seq_count, offset=offset)
    offset += pointers.nbytes
    docs = np.frombuffer(raw, dtype=np.int64, count=doc_count, offset=offset)
    data = np.fromfile(f"{prefix}.bin", dtype=dtype)
    return IndexedDataset(dtype, lengths, pointers, docs, data)


# ---------------------------------------------------------------------------------- one split / all


def write_split(out: Path, split: str, rows: Iterable[dict], *, vocab_size: int | None) -> dict:
    """Write one split (`rows`: HF-path rows) in both formats; returns its paths and counts."""
    packed = [to_packed_row(r) for r in rows]
    parquet = out / f"{split}.idx.parquet"
    write_packed_parquet(parquet, packed)
    prefix = out / f"{split}_text_document"
    documents = ((r.input_ids, [e - s for s, e in zip(r.seq_start_id, list(r.seq_start_id[1:]) + [len(r.input_ids)])])
                 for r in packed)
    sequences, docs = write_indexed_dataset(prefix, documents, dtype=token_dtype(vocab_size))
    return {"parquet": str(parquet), "prefix": str(prefix), "rows": len(packed), "samples": sequences,
            "metadata": pack_metadata(packed)}


def write_megatron_data(lm_data, out: Path, *, vocab_size: int | None, eos_id: int | None) -> dict:
    """Write the training (and validation) rows of `lm_data` (`components.lm_data.LMData`) under
    `out`; returns what the Megatron configuration needs: file paths, row counts, and how many HF
    targets Megatron's collate function would drop (it masks positions whose input is EOS)."""
    out.mkdir(parents=True, exist_ok=True)
    info: dict = {"root": str(out)}
    metadata = []
    for split, rows in (("training", lm_data.train), ("validation", lm_data.eval)):
        if rows is None:
            continue
        rows = list(rows)
        info[split] = write_split(out, split, rows, vocab_size=vocab_size)
        metadata.append(info[split].pop("metadata"))
        if eos_id is not None:
            dropped = sum(len(hf_targets(r)) - len(megatron_targets(to_packed_row(r), eos_id)) for r in rows)
            info[split]["targets_dropped_after_eos"] = dropped
    meta_path = out / "pack_metadata.json"
    meta_path.write_text(json.dumps(metadata) + "\n")
    info["metadata"] = str(meta_path)
    (out / "megatron_data.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
