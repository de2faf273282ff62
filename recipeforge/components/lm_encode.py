"""Causal-LM rows to token ids and labels, a chunk of rows at a time, as flat arrays.

The result is the same as `lm_data.tokenize_batch` row by row (the tests pin it), without its per-token
Python work: every text of a chunk goes through the Rust tokenizer in one call, the trained tokens of a
chat reply are found as a token range by bisecting the token offsets (not by reading each offset), labels
are masked with numpy, and the output is flat int32 arrays that become Arrow list columns without
a Python list per row. With several processes, chunks are tokenized in forked workers, in order.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from recipeforge.components.chat_templates import GENERATION_TAG
from recipeforge.components.formats import Format, RenderOptions, get_format
from recipeforge.components.packing import IGNORE, gather_index
from recipeforge.errors import RecipeError

OK, TRUNCATED, TOO_LONG, NO_TARGET, SPLIT = 0, 1, 2, 3, 4
KEPT = (OK, TRUNCATED, SPLIT)
CHUNK_ROWS = 2048           # rows per tokenizer call (and per task handed to a worker)
MIN_ROWS_PER_PROCESS = 1000  # below this a forked worker costs more than it saves
AUTO_MAX_PROCESSES = 8      # `num_proc: auto` never starts more (memory, and reading the rows stays serial)
MAX_CHUNK_VALUES = 2**31 - 1  # Arrow list offsets are int32


@dataclass(frozen=True)
class EncodeOptions:
    """What decides the ids and labels besides the rows and the tokenizer."""

    train_on_inputs: bool       # every token trained (also: pretraining, where nothing is masked)
    sequence_len: int
    truncation: str             # "truncate" | "drop"
    split_long: bool = False    # pretraining: a long document becomes several samples
    eot_tokens: tuple[str, ...] = ()


@dataclass
class Encoded:
    """Samples as flat arrays: `ids`/`labels` of all samples end to end, `lengths` per sample, and the
    status of every sample produced (kept ones, and the dropped ones as empty samples)."""

    ids: Any        # np.int32 [total]
    labels: Any     # np.int32 [total]
    lengths: Any    # np.int64 [samples kept]
    status: Any     # np.int8 [samples produced]
    rows: Any = None  # np.int64 [samples kept]: the chunk row each kept sample comes from


def resolve_processes(num_proc: int | str, rows: int) -> int:
    """Worker processes for tokenizing `rows` rows: `num_proc` (``auto``: one per CPU core this process may
    run on, at most 8), fewer when there are under `MIN_ROWS_PER_PROCESS` rows per process; 1 means no
    workers (the tokenizer still uses every core for its own part)."""
    if num_proc == "auto":
        num_proc = auto_processes()
    return max(1, min(int(num_proc), rows // MIN_ROWS_PER_PROCESS))


def auto_processes() -> int:
    """What ``data.num_proc: auto`` means here: one process per available core, at most `AUTO_MAX_PROCESSES`."""
    return min(available_cores(), AUTO_MAX_PROCESSES)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a Slurm or container limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def encode_rows(columns: dict[str, list], fmt: Format, tokenizer, options: EncodeOptions) -> Encoded:
    """Token ids, labels and status of a chunk of rows of one format (columns as lists, with ``_row``)."""
    from recipeforge.components.tokenizer import special_prefix_ids

    prefix = tuple(special_prefix_ids(tokenizer))  # also resets the backend's truncation/padding, as a call does
    opts = RenderOptions(tokenizer, train_on_inputs=options.train_on_inputs, prefix_ids=prefix,
                         eos_token=tokenizer.eos_token, eot_tokens=tuple(options.eot_tokens))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    texts, rows = _plan(columns, fmt, opts, backend)
    encodings = _encode(tokenizer, backend, texts)
    layout = _lay_out(rows, encodings, backend)
    flat, labels, before = _label(layout)
    return _cut(flat, labels, before, layout.row_start, layout.row_len, options)


def _plan(columns: dict[str, list], fmt: Format, opts: RenderOptions, backend) -> tuple[list, list]:
    """Texts to tokenize and per-row parts (see `_plan_rows`): chat rows whose template has generation
    blocks rendered for the whole chunk at once when the tokenizer is fast, else row by row."""
    from recipeforge.components.chat_masks import template_of

    tokenizer = opts.tokenizer
    template = template_of(tokenizer) if fmt.to_messages is not None else None
    # Chat rows through a template with generation blocks: rendered here, tokenized whole with the other texts.
    whole_chats = (template is not None and GENERATION_TAG.search(template) is not None and backend is not None
                   and getattr(tokenizer, "is_fast", False))
    if whole_chats:
        try:
            return _plan_chats(columns, fmt, opts, template)
        except Exception:  # a malformed row: the row-by-row pass below names it, as the reference does
            pass
    return _plan_rows(columns, fmt, opts, template if whole_chats else None)


@dataclass
class _Layout:
    """A chunk's pieces of token ids end to end: where each row starts and how long it is, and the token
    ranges with labels (positions in the chunk's flat ids)."""

    pieces: list = field(default_factory=list)
    trained_from: list = field(default_factory=list)
    trained_to: list = field(default_factory=list)
    row_start: list = field(default_factory=list)
    row_len: list = field(default_factory=list)
    total: int = 0


def _lay_out(rows: list, encodings: list, backend) -> _Layout:
    """Each row's parts put end to end, with the token ranges of their trained parts."""
    out = _Layout()
    pos = 0
    for parts in rows:
        start = pos
        for piece, trained in parts:
            if isinstance(piece, int):
                enc = encodings[piece]
                ids = enc.ids if backend is not None else enc
            else:
                enc, ids = None, piece
            n = len(ids)
            out.pieces.append(ids)
            for a, b in _trained_ranges(enc, trained, n):
                out.trained_from.append(pos + a)
                out.trained_to.append(pos + b)
            pos += n
        out.row_start.append(start)
        out.row_len.append(pos - start)
    out.total = pos
    return out


def _trained_ranges(enc, trained, n: int) -> list[tuple[int, int]]:
    """Token ranges of a piece of `n` tokens that get labels: all, none, or those of character spans."""
    from recipeforge.components.chat_masks import span_token_ranges

    if trained is True:
        return [(0, n)]
    if trained is False:
        return []
    ranges = span_token_ranges(enc, trained)
    if ranges is None:  # a token without offsets: mark token by token as the reference does
        ranges = _ranges_from_offsets(enc.offsets, trained)
    return ranges


def _label(layout: _Layout):
    """The flat ids, their labels (IGNORE outside the trained ranges) and the count of trained tokens
    before each position."""
    import numpy as np

    pos = layout.total
    flat = np.fromiter(itertools.chain.from_iterable(layout.pieces), dtype=np.int32, count=pos)
    edges = np.bincount(np.asarray(layout.trained_from, dtype=np.int64), minlength=pos + 1)[: pos + 1] - \
        np.bincount(np.asarray(layout.trained_to, dtype=np.int64), minlength=pos + 1)[: pos + 1]
    is_trained = np.cumsum(edges)[:pos] > 0
    labels = np.where(is_trained, flat, np.int32(IGNORE)).astype(np.int32)
    # Trained tokens before each position, to find rows with no target left without a per-token pass.
    before = np.concatenate(([0], np.cumsum(is_trained, dtype=np.int64)))
    return flat, labels, before


def _plan_chats(columns: dict[str, list], fmt: Format, opts: RenderOptions, template: str) -> tuple[list, list]:
    """Texts to tokenize and per-row parts for chat rows, the whole chunk rendered in one call."""
    from recipeforge.components.chat_masks import render_many, select_spans, without_flags

    n = len(columns["_row"])
    rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    for row in rows:
        for col in fmt.required:
            if row.get(col) in (None, ""):
                raise ValueError(col)
    messages = [fmt.to_messages(row) for row in rows]
    texts, parts = [], []
    for i, (text, spans) in enumerate(render_many(opts.tokenizer, [without_flags(m) for m in messages], template)):
        trained = select_spans(messages[i], spans, train_on_inputs=opts.train_on_inputs)
        parts.append([(i, True if trained is None else trained)])
        texts.append(text)
    return texts, parts


def _plan_rows(columns: dict[str, list], fmt: Format, opts: RenderOptions, template: str | None
               ) -> tuple[list, list]:
    """Texts to tokenize and per-row parts ``(text index or token ids, trained: bool or character spans)``,
    row by row (chat rows with `template`: rendered whole), with the reference's row errors."""
    from recipeforge.components.chat_masks import trained_spans

    keys = list(columns)
    texts: list[str] = []
    rows: list[list[tuple]] = []
    for i in range(len(columns[keys[0]])):
        row = {k: columns[k][i] for k in keys}
        for col in fmt.required:
            if row.get(col) in (None, ""):
                raise RecipeError(f"row {row['_row']}: column '{col}' is empty")
        try:
            if template is not None:
                text, spans = trained_spans(opts.tokenizer, fmt.to_messages(row), template,
                                            train_on_inputs=opts.train_on_inputs)
                rows.append([(len(texts), True if spans is None else spans)])
                texts.append(text)
                continue
            segments = fmt.render(row, opts)
        except RecipeError as exc:
            raise RecipeError([type(p)(f"row {row['_row']}: {p.message}", p.location, p.key, p.hint)
                               for p in exc.problems]) from None
        parts = []
        for piece, trained in segments:
            if isinstance(piece, str):
                parts.append((len(texts), bool(trained)))
                texts.append(piece)
            else:
                parts.append((list(piece), bool(trained)))
        rows.append(parts)
    return texts, rows


def _encode(tokenizer, backend, texts: list[str]) -> list:
    """Encodings of many texts with no special tokens added: `tokenizers.Encoding`s from a fast tokenizer
    (the same ids a call to the tokenizer gives), plain id lists from a slow one."""
    if not texts:
        return []
    if backend is not None:
        return backend.encode_batch(texts, add_special_tokens=False)
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _ranges_from_offsets(offsets: list, spans: list) -> list[tuple[int, int]]:
    """Token ranges overlapping `spans`, token by token (tokens without offsets are never trained)."""
    out: list[tuple[int, int]] = []
    k = 0
    for t, off in enumerate(offsets):
        if off is None:
            continue
        start, end = off
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if k < len(spans) and start < spans[k][1] and max(end, start + 1) > spans[k][0]:
            if out and out[-1][1] == t:
                out[-1] = (out[-1][0], t + 1)
            else:
                out.append((t, t + 1))
    return out


def _cut(flat, labels, before, row_start: list[int], row_len: list[int], options: EncodeOptions) -> Encoded:
    """Apply `sequence_len`: cut, drop or split long rows, drop rows with nothing to train on."""
    import numpy as np

    seq = options.sequence_len
    out_start: list[int] = []
    out_len: list[int] = []
    out_row: list[int] = []
    status: list[int] = []
    starts = np.asarray(row_start, dtype=np.int64)
    kept = np.minimum(np.asarray(row_len, dtype=np.int64), seq)
    # Labels after the first position of the kept part (the first token predicts nothing).
    targets = (before[starts + kept] - before[starts + np.minimum(kept, 1)]).tolist()
    for i, (start, n) in enumerate(zip(row_start, row_len)):
        state = OK
        if n > seq:
            if options.truncation == "drop":
                status.append(TOO_LONG)
                continue
            if options.split_long:
                for piece in range(start, start + n, seq):
                    size = min(seq, start + n - piece)
                    if size > 1:  # a 1-token tail predicts nothing
                        out_start.append(piece)
                        out_len.append(size)
                        out_row.append(i)
                        status.append(SPLIT)
                continue
            n, state = seq, TRUNCATED
        if targets[i] == 0:
            status.append(NO_TARGET)  # nothing to learn (e.g. the answer was cut off)
            continue
        out_start.append(start)
        out_len.append(n)
        out_row.append(i)
        status.append(state)
    lengths = np.asarray(out_len, dtype=np.int64)
    index = gather_index(np.asarray(out_start, dtype=np.int64), lengths)
    return Encoded(flat[index], labels[index], lengths, np.asarray(status, dtype=np.int8),
                   np.asarray(out_row, dtype=np.int64))


def to_arrow(columns: dict, lengths):
    """list<int32> columns (the cache layout) from flat arrays of samples end to end and their `lengths`. List
    offsets are int32, so more than 2**31 - 1 tokens are split into several Arrow chunks of the same columns."""
    import numpy as np
    import pyarrow as pa

    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    chunks: dict[str, list] = {name: [] for name in columns}
    first = 0
    while True:
        base = int(ends[first - 1]) if first else 0
        last = int(np.searchsorted(ends, base + MAX_CHUNK_VALUES, side="right"))  # rows [first, last)
        last = max(last, min(first + 1, len(ends)))
        offsets = pa.array(np.concatenate(([0], ends[first:last] - base)).astype(np.int32))
        top = int(ends[last - 1]) if last > first else base
        for name, values in columns.items():
            chunks[name].append(pa.ListArray.from_arrays(offsets, pa.array(values[base:top], type=pa.int32())))
        if last >= len(ends):
            break
        first = last
    return pa.table({k: pa.chunked_array(v, type=pa.list_(pa.int32())) for k, v in chunks.items()})


# The dataset being tokenized, for forked workers (they inherit it; nothing is pickled on the way in).
_JOB: tuple | None = None


def _work(bounds: tuple[int, int]) -> Encoded:
    ds, fmt_name, tokenizer, options = _JOB
    return encode_rows(ds[bounds[0]:bounds[1]], get_format(fmt_name), tokenizer, options)


def encode_dataset(ds, fmt: Format, tokenizer, options: EncodeOptions, *, num_proc: int | str = 1,
                   sink: Callable[[Any], None] | None = None):
    """Tokenize a `datasets.Dataset` of one format: an Arrow table of the kept samples and the status of
    every sample produced (np.int8). Rows are taken in chunks; with several processes the chunks go to
    forked workers and come back in order, so the result (and the first row error) is the same. With a
    `sink`, each chunk's table goes to it as soon as it is made (nothing is kept) and the table returned
    is None: memory then holds a chunk, not the corpus (`lm_store.SampleFile`)."""
    import numpy as np
    import pyarrow as pa

    tables, statuses = [], []
    for part in _encoded_parts(ds, fmt, tokenizer, options, num_proc):
        statuses.append(part.status)
        table = to_arrow({"input_ids": part.ids, "labels": part.labels}, part.lengths)
        if sink is None:
            tables.append(table)
        else:
            sink(table)
    status = np.concatenate(statuses) if statuses else np.zeros(0, np.int8)
    if sink is not None:
        return None, status
    empty = {"input_ids": np.zeros(0, np.int32), "labels": np.zeros(0, np.int32)}
    return (pa.concat_tables(tables) if tables else to_arrow(empty, [])), status


def _encoded_parts(ds, fmt: Format, tokenizer, options: EncodeOptions, num_proc: int | str):
    """The encoded chunks of `ds`, in row order, from this process or forked workers."""
    global _JOB
    import multiprocessing

    n = len(ds)
    bounds = [(a, min(a + CHUNK_ROWS, n)) for a in range(0, n, CHUNK_ROWS)]
    processes = min(resolve_processes(num_proc, n), len(bounds))
    if processes > 1 and "fork" not in multiprocessing.get_all_start_methods():
        processes = 1  # workers inherit the tokenizer and the rows by forking; without fork, one process
    _JOB = (ds, fmt.name, tokenizer, options)
    try:
        if processes <= 1:
            for b in bounds:
                yield _work(b)
        else:
            with _tokenizer_threads_off():
                with multiprocessing.get_context("fork").Pool(processes) as pool:
                    yield from pool.imap(_work, bounds)
    finally:
        _JOB = None


@contextlib.contextmanager
def _tokenizer_threads_off():
    """Workers tokenize one text at a time (each has a core; the Rust thread pool would only compete), and
    forking after the pool ran makes `tokenizers` warn: the switch is set before forking, then restored."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
