"""Streamed causal-LM data (``data.streaming: true``): rows read, tokenized and packed while training runs.

Nothing of the corpus is cached: the datasets are opened as `datasets` streams (local files, folders or
glob patterns of JSONL/Parquet/CSV/text shards, hub datasets, and anything else `datasets`/fsspec can
stream), and each training process reads its own share of the rows (`split_dataset_by_node`: whole
shards when there are enough of them for every process, else every N-th row).

Rows are taken a window at a time (``data.stream_window`` rows). A window is tokenized and masked by the
same code as the cached path (`lm_encode.encode_rows`, one chunk per dataset), packed with the same
best-fit-decreasing bins (`pack_to_disk`'s layout: bins in order, a bin's samples in row order, the
first label of each sample ignored, positions restarting), and its sequences are shuffled with a seed of
their own (``train.seed``, the pass and the window), so a window always yields the same sequences in
the same order. On a corpus that fits one window this is exactly the cached path's output.

The stream never ends: when the rows run out, the next pass starts (``train.max_steps`` says how long
training lasts). Where a process stands is a `StreamPosition` (the pass, the window, the source's own
state at the window's first row and how many of the window's sequences were handed out); it is saved
in every checkpoint (``stream/rank-<r>.json``) and a resume reopens the source at that window and
skips the sequences already trained on: no row is trained twice and none is skipped.
"""

from __future__ import annotations

import contextlib
import glob as globbing
import itertools
import json
import logging
import os
import queue
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch.utils.data

from recipeforge.components.data import (LOCAL_BUILDERS, DatasetRef, Locate, _first_line, _no_location, no_telemetry,
                                         apply_prompt, resolve_local, spec_base_dir)
from recipeforge.components.formats import Format, get_format
from recipeforge.components.lm_encode import (CHUNK_ROWS, NO_TARGET, SPLIT, TOO_LONG, TRUNCATED, EncodeOptions,
                                              encode_rows)
from recipeforge.components.packing import IGNORE, best_fit_decreasing
from recipeforge.errors import RecipeError

STATE_FOLDER = "stream"        # in a checkpoint: stream/rank-<r>.json, one per training process
SOURCE, ROW = "_source", "_row"  # the dataset a row comes from (its index in data.datasets), its 1-based row


@dataclass(frozen=True)
class StreamPosition:
    """Where a process's stream stands: sequences `skip` onward of window `window` of pass `passes`,
    whose first row the source reaches from `source` (its `state_dict`; None: the start of the pass)."""

    passes: int = 0
    window: int = 0
    source: dict | None = None
    skip: int = 0
    rows: int = 0           # rows this process read in earlier windows (all passes)
    sequences: int = 0      # sequences it handed out (all passes)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "StreamPosition":
        return cls(**json.loads(text))


@dataclass
class WindowCounts:
    """What happened to the rows of the windows read so far (the cached path's data statistics)."""

    rows: int = 0
    samples: int = 0
    truncated: int = 0
    split_samples: int = 0
    dropped_too_long: int = 0
    dropped_no_target: int = 0

    def add(self, status) -> None:
        import numpy as np

        found = np.bincount(status, minlength=SPLIT + 1) if len(status) else np.zeros(SPLIT + 1, dtype=np.int64)
        self.truncated += int(found[TRUNCATED])
        self.split_samples += int(found[SPLIT])
        self.dropped_too_long += int(found[TOO_LONG])
        self.dropped_no_target += int(found[NO_TARGET])


def open_stream(data, *, base_dir: Path | None, locate: Locate = _no_location, seed: int, rank: int = 0,
                world: int = 1):
    """The training rows of `data.datasets` as one `datasets.IterableDataset`, with ``_source`` and
    ``_row`` on every row, mixed by weight when weights are given (else one dataset after the other),
    this process's share only."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    parts = [_open_one(DatasetRef(spec, "datasets", i), base_dir=base_dir, locate=locate)
             for i, spec in enumerate(data.datasets)]
    if len(parts) == 1:
        rows = parts[0]
    elif any(s.weight is not None for s in data.datasets):
        weights = [1.0 if s.weight is None else s.weight for s in data.datasets]
        total = sum(weights)
        rows = datasets.interleave_datasets(parts, probabilities=[w / total for w in weights], seed=seed,
                                            stopping_strategy=data.mix_stopping)
    else:
        rows = datasets.concatenate_datasets(parts)
    return split_dataset_by_node(rows, rank=rank, world_size=world) if world > 1 else rows


def _open_one(ref: DatasetRef, *, base_dir: Path | None, locate: Locate):
    """One dataset entry as a stream in its format's columns, with ``_source`` and ``_row``."""
    spec = ref.spec
    where = locate(ref.path_key + ("path",))
    fmt = get_format(spec.format, key=f"{ref.key}.format", location=locate(ref.path_key + ("format",)))
    if fmt.kind != "lm":
        raise RecipeError(f"format '{fmt.name}' does not fit this stage", key=f"{ref.key}.format",
                          location=locate(ref.path_key + ("format",)))
    no_telemetry()
    try:
        ds = _stream_of(ref, base_dir=base_dir, locate=locate)
        if ds.column_names is None:
            ds = _with_columns(ds)
        columns = ds.column_names
    except RecipeError:
        raise
    except Exception as exc:  # datasets raises many types; all mean "could not read this dataset"
        raise RecipeError(f"cannot stream dataset '{spec.path}': {_first_line(exc)}", key=f"{ref.key}.path",
                          location=where, hint="check the path (a file, a folder, a glob such as shards/*.jsonl, "
                                               "or a hub id) and that the files are readable") from None
    if not columns:
        raise RecipeError(f"dataset '{spec.path}' has no rows", key=f"{ref.key}.path", location=where)
    if spec.messages is not None:
        from recipeforge.components.messages import apply_message_fields

        ds = apply_message_fields(ds, spec.messages, key=f"{ref.key}.messages",
                                  where=locate(ref.path_key + ("messages",)))
    ds, fmt = apply_prompt(ds, ref, fmt, locate=locate)
    if ds.column_names is None:  # a stream rendered with a text prompt learns its new columns from its first rows
        ds = _with_columns(ds)
    ds = ds.select_columns([c for c in ds.column_names if c in fmt.required + fmt.optional])
    if spec.max_samples:
        ds = ds.take(spec.max_samples)  # the first rows: a stream cannot be shuffled whole
    index = ref.index
    return ds.map(lambda row, i: {SOURCE: index, ROW: i + 1}, with_indices=True)


def _with_columns(ds):
    """The stream with its columns known (JSON streams learn theirs from the first rows), which
    `remap_and_check` reads."""
    return ds._resolve_features()


def _stream_of(ref: DatasetRef, *, base_dir: Path | None, locate: Locate):
    """`datasets.load_dataset(..., streaming=True)` of a file, a glob of files, a folder or a hub id."""
    import datasets

    spec = ref.spec
    files = _shard_files(ref, base_dir=base_dir, locate=locate)
    if files is not None:
        builder = LOCAL_BUILDERS.get(Path(files[0]).suffix.lower())
        if builder is None:
            raise RecipeError(f"unsupported data file type '{Path(files[0]).suffix}' ({files[0]})",
                              key=f"{ref.key}.path", location=locate(ref.path_key + ("path",)),
                              hint=f"use one of {', '.join(sorted(LOCAL_BUILDERS))}")
        return datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
    found = resolve_local(ref, base_dir=base_dir, locate=locate)
    if found is not None:
        return datasets.load_dataset(str(found), name=spec.name, split=spec.split, streaming=True)
    return datasets.load_dataset(spec.path, name=spec.name, split=spec.split, streaming=True)


def _shard_files(ref: DatasetRef, *, base_dir: Path | None, locate: Locate) -> list[str] | None:
    """The local files a dataset path names: itself, or the files a glob pattern matches (sorted);
    None for folders and hub ids."""
    spec = ref.spec
    base = spec_base_dir(ref, base_dir, locate)
    if any(ch in spec.path for ch in "*?["):
        pattern = spec.path if os.path.isabs(os.path.expanduser(spec.path)) or base is None \
            else str(base / spec.path)
        files = sorted(globbing.glob(os.path.expanduser(pattern)))
        if not files:
            raise RecipeError(f"no data files match '{spec.path}' (looked for {pattern})", key=f"{ref.key}.path",
                              location=locate(ref.path_key + ("path",)),
                              hint="patterns are relative to the recipe file's folder")
        return files
    found = resolve_local(ref, base_dir=base_dir, locate=locate)
    return [str(found)] if found is not None and found.is_file() else None


class StreamedLM(torch.utils.data.IterableDataset):
    """The training sequences of one process, made from its stream window by window (module docstring).

    Hands out ``{input_ids, labels[, position_ids], _rows}`` rows (``_rows``: the ``[dataset, row]`` of
    each sample in the sequence, for ``data.stream_log``); `position` is where the next one comes from,
    exact as long as what was handed out was trained on (one process reading, no prefetching)."""

    def __init__(self, open_rows: Callable[[], Any], formats: list[Format], tokenizer, options: EncodeOptions, *,
                 packing: bool, window_rows: int, shuffle: bool, seed: int):
        self.open_rows, self.formats, self.tokenizer, self.options = open_rows, formats, tokenizer, options
        self.packing, self.window_rows, self.shuffle, self.seed = packing, window_rows, shuffle, seed
        self.position = StreamPosition()
        self.counts = WindowCounts()
        self.order_log: Path | None = None  # data.stream_log: where the trainer writes each step's rows

    def __iter__(self) -> Iterator[dict]:
        start = self.position
        for passes in itertools.count(start.passes):
            resume = start if passes == start.passes else StreamPosition(passes=passes, rows=self.position.rows,
                                                                         sequences=self.position.sequences)
            emitted = yield from self._one_pass(resume)
            if not emitted and resume.source is None and resume.window == 0:
                raise RecipeError("the training stream gave no sequence to train on in a whole pass over the data",
                                  key="data.datasets",
                                  hint="check data.sequence_len and data.truncation (rows may all be too long or "
                                       "have no trained tokens)")

    def _one_pass(self, start: StreamPosition):
        """One pass over the rows from `start`; returns whether it handed out any sequence. The next
        window is read and tokenized in a thread while this one's sequences train."""
        emitted, skip = False, start.skip
        for window in _made_ahead(self._windows(start)):
            for k in range(skip, len(window.sequences)):
                self.position = StreamPosition(passes=start.passes, window=window.index, source=window.state,
                                               skip=k + 1, rows=window.rows_before,
                                               sequences=self.position.sequences + 1)
                emitted = True
                yield window.sequences[k]
            skip = 0
            self.position = StreamPosition(passes=start.passes, window=window.index + 1, source=window.state_after,
                                           skip=0, rows=window.rows_before + window.rows,
                                           sequences=self.position.sequences)
        return emitted

    def _windows(self, start: StreamPosition) -> Iterator["_Window"]:
        """The windows of one pass from `start`'s window on, each with the source's state at its first row
        and after its last."""
        source = self.open_rows()
        if start.source is not None:
            source.load_state_dict(start.source)
        rows = iter(source)
        index, state, before = start.window, start.source, start.rows
        while True:
            with _read_failures() as failures:
                try:
                    chunk = list(itertools.islice(rows, self.window_rows))
                except (RecipeError, KeyboardInterrupt, MemoryError):
                    raise
                except Exception as exc:  # a shard past the pre-check that cannot be read
                    raise _unreadable(exc, failures, before) from None
            if not chunk:
                return
            after = source.state_dict()  # read before the next window's first row
            yield _Window(index, state, after, before, len(chunk), self.window_sequences(chunk, start.passes, index))
            index, state, before = index + 1, after, before + len(chunk)

    def window_sequences(self, chunk: list[dict], passes: int, window: int) -> list[dict]:
        """The sequences of one window of rows, in the order they are handed out."""
        import numpy as np

        ids, labels, lengths, origin = [], [], [], []
        for source in sorted({r[SOURCE] for r in chunk}):
            fmt = self.formats[source]
            rows = [r for r in chunk if r[SOURCE] == source]
            # A tokenizer call per CHUNK_ROWS rows, as the cached path: its encodings (offsets and all)
            # are much larger than the ids they give.
            for part in (rows[i:i + CHUNK_ROWS] for i in range(0, len(rows), CHUNK_ROWS)):
                columns = {c: [r.get(c) for r in part] for c in (*fmt.required, *fmt.optional, ROW)}
                columns["_format"] = [fmt.name] * len(part)
                encoded = encode_rows(columns, fmt, self.tokenizer, self.options)
                self.counts.add(encoded.status)
                ids.append(encoded.ids)
                labels.append(encoded.labels)
                lengths.append(encoded.lengths)
                origin.extend([source, int(columns[ROW][i])] for i in encoded.rows)
        self.counts.rows += len(chunk)
        flat_ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        flat_labels = np.concatenate(labels) if labels else np.zeros(0, np.int32)
        sample_len = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.counts.samples += len(sample_len)
        groups = (best_fit_decreasing(sample_len.tolist(), self.options.sequence_len) if self.packing
                  else [[i] for i in range(len(sample_len))])
        out = self._sequences([sorted(g) for g in groups], flat_ids, flat_labels, sample_len, origin)
        if self.shuffle:
            order = np.random.default_rng([self.seed, passes, window]).permutation(len(out))
            out = [out[i] for i in order]
        return out

    def _sequences(self, groups: list[list[int]], ids, labels, lengths, origin) -> list[dict]:
        """The training rows of a window: each group's samples end to end (packed), or one sample each, as
        int32 arrays (views of one array per column: a window's tokens are held once)."""
        import numpy as np

        from recipeforge.components.packing import gather_index

        samples = np.fromiter(itertools.chain.from_iterable(groups), dtype=np.int64)
        sample_len = lengths[samples]
        starts = np.cumsum(lengths) - lengths
        index = gather_index(starts[samples], sample_len)
        row_ids, row_labels = ids[index], labels[index]  # copies, in the order of the rows
        first = np.cumsum(sample_len) - sample_len  # where each sample begins in that order
        positions = (np.arange(len(index), dtype=np.int64) - np.repeat(first, sample_len)).astype(np.int32)
        if self.packing:
            row_labels[first[sample_len > 0]] = IGNORE  # nothing before a sample in its sequence predicts it
        bounds = np.cumsum([int(lengths[g].sum()) for g in groups])[:-1]
        out = []
        for group, a, b, c in zip(groups, np.split(row_ids, bounds), np.split(row_labels, bounds),
                                  np.split(positions, bounds)):
            row = {"input_ids": a, "labels": b, "_rows": [origin[i] for i in group]}
            if self.packing:
                row["position_ids"] = c
            out.append(row)
        return out

    # --- checkpoints ----------------------------------------------------------------------------
    def save(self, checkpoint: Path, rank: int) -> None:
        """Write this process's position into `checkpoint` (its ``stream`` folder)."""
        folder = Path(checkpoint) / STATE_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".rank-{rank}.json.tmp"
        tmp.write_text(self.position.to_json())
        os.replace(tmp, folder / f"rank-{rank}.json")

    def restore(self, checkpoint: Path, rank: int, world: int) -> None:
        """Continue from the position saved in `checkpoint` by the process of the same rank."""
        folder = Path(checkpoint) / STATE_FOLDER
        saved = sorted(folder.glob("rank-*.json")) if folder.is_dir() else []
        if not saved:
            raise RecipeError(f"checkpoint {checkpoint} has no stream position: it was not saved by a streamed run",
                              key="data.streaming",
                              hint="resume with the data settings it was saved with, or start a new run (--overwrite)")
        if len(saved) != world:
            raise RecipeError(f"checkpoint {checkpoint} holds the stream positions of {len(saved)} processes, and "
                              f"this run has {world}: each process reads its own share of the stream",
                              key="data.streaming", hint=f"resume on {len(saved)} processes")
        state = folder / f"rank-{rank}.json"
        try:
            self.position = StreamPosition.from_json(state.read_text())
        except (OSError, ValueError, TypeError) as exc:  # damaged, or written by another version
            raise RecipeError(f"{state}: not a readable stream position ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})", key="data.streaming",
                              hint="resume from another checkpoint (output.resume=PATH), or start a new run "
                                   "(--overwrite)") from None

    def stats(self) -> dict[str, Any]:
        """The data statistics: how the stream is read, and what happened to the rows read so far."""
        read = {k: v for k, v in asdict(self.counts).items() if v} if self.counts.rows else {}
        return {"streamed": True, "window_rows": self.window_rows, **read}


class _FailureLog(logging.Handler):
    """The messages `datasets` logs as it fails to read a file (they name the file; its exception does not)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # a record that cannot be formatted names no file
            pass


@contextlib.contextmanager
def _read_failures() -> Iterator[_FailureLog]:
    handler = _FailureLog()
    logger = logging.getLogger("datasets")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _unreadable(exc: BaseException, failures: _FailureLog, rows_before: int) -> RecipeError:
    """The error for a stream that failed mid-run: the shard (from `datasets`' own log) and what is wrong,
    as a user error; the run stops there, its newest checkpoint kept."""
    import re

    files = [m.group(1) for message in failures.messages for m in [re.search(r"file '([^']+)'", message)] if m]
    where = f" in {files[-1]}" if files else ""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    # The first line says what failed, the last (a cast's "because column names don't match") often why.
    detail = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return RecipeError(f"a streamed data file cannot be read{where} ({type(exc).__name__}: {detail[:300]}), after "
                       f"{rows_before} rows of this process's stream", key="data.datasets",
                       hint="fix or remove the damaged file, then run the same command again: training resumes from "
                            "the newest checkpoint")


@dataclass(frozen=True)
class _Window:
    """One window of a pass: its sequences, and where the source stood at its first row and after its last."""

    index: int
    state: dict | None
    state_after: dict
    rows_before: int
    rows: int
    sequences: list = field(repr=False)


def _made_ahead(windows: Iterator[_Window]) -> Iterator[_Window]:
    """`windows`, each made in a thread while the one before it is handed out (tokenizing releases the
    GIL); an error there is raised here, and the thread stops when the consumer does."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for window in windows:
                if not put(window):
                    return
            put(end)
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_Failed(exc))

    threading.Thread(target=make, name="recipeforge-stream", daemon=True).start()
    try:
        while True:
            item = ready.get()
            if item is end:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def write_order(path: Path, step: int, rows: list[dict]) -> None:
    """Append one batch's rows to a ``data.stream_log`` file: ``{"step": N, "rows": [[dataset, row], ...]}``."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "rows": [r for row in rows for r in row["_rows"]]}) + "\n")


def trim_order(path: Path, step: int) -> None:
    """Keep the lines of a ``data.stream_log`` file up to optimizer step `step` (a resume from the
    checkpoint of that step trains the later ones again), written atomically."""
    path = Path(path)
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as fh:
        kept = [line for line in fh if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)
