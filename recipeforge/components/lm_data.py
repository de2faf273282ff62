"""Causal-LM data (pretrain, SFT): render, tokenize, mask, truncate, pack, and cache.

The result is cached on disk under a fingerprint of the data files, the tokenizer and every option
that changes the token ids, so a second run (or `recipeforge preprocess` ahead of time) skips the work.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipeforge.components.data import Locate, _no_location, derived_fingerprint, load_split
from recipeforge.components.fingerprint import data_fingerprint
from recipeforge.components.formats import RenderOptions, get_format
from recipeforge.components.lm_encode import (NO_TARGET, OK, SPLIT, TOO_LONG, TRUNCATED, EncodeOptions,
                                              encode_dataset)
from recipeforge.components.lm_store import SampleFile, pack_to_disk, row_lengths, trained_tokens
from recipeforge.components.packing import IGNORE
from recipeforge.components.tokenizer import special_prefix_ids
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import stage_spec


@dataclass
class LMData:
    """Tokenized (and maybe packed) train/eval sets plus what happened on the way."""

    train: Any
    eval: Any
    packed: bool
    stats: dict = field(default_factory=dict)
    fingerprint: str = ""
    cache_path: Path | None = None


def default_cache_root() -> Path:
    """Where tokenized data is cached unless `data.cache_dir` says otherwise."""
    from recipeforge.settings import current

    return current().cache_root()


def tokenize_batch(batch: dict, *, tokenizer, train_on_inputs: bool, sequence_len: int, truncation: str,
                   mask_inputs: bool, split_long: bool = False, eot_tokens: tuple[str, ...] = ()) -> dict:
    """Render and tokenize a batch of rows, row by row: the reference computation.

    `lm_encode.encode_rows` (what `prepare_lm_data` runs) gives the same ids, labels and statuses
    without per-token Python work; the tests compare the two. Rows longer than
    `sequence_len` are cut, dropped, or with `split_long` (pretraining documents) cut into several
    samples, so that no text is thrown away.
    """
    prefix = tuple(special_prefix_ids(tokenizer))
    opts = RenderOptions(tokenizer, train_on_inputs=train_on_inputs or not mask_inputs, prefix_ids=prefix,
                         eos_token=tokenizer.eos_token, eot_tokens=tuple(eot_tokens))
    keys = list(batch)
    n = len(batch[keys[0]])
    rendered = []
    for i in range(n):
        row = {k: batch[k][i] for k in keys}
        fmt = get_format(row["_format"])
        for col in fmt.required:
            if row.get(col) in (None, ""):
                raise RecipeError(f"row {row['_row']}: column '{col}' is empty")
        try:
            rendered.append(fmt.render(row, opts))
        except RecipeError as exc:
            raise RecipeError([type(p)(f"row {row['_row']}: {p.message}", p.location, p.key, p.hint)
                               for p in exc.problems]) from None
    texts = [piece for segs in rendered for piece, _ in segs if isinstance(piece, str)]
    encoded = iter(_encode(tokenizer, texts)) if texts else iter(())
    out_ids, out_labels, status = [], [], []
    for segs in rendered:
        ids: list[int] = []
        labels: list[int] = []
        for piece, trained in segs:
            piece_ids = list(piece) if not isinstance(piece, str) else next(encoded)
            ids.extend(piece_ids)
            labels.extend(piece_ids if trained else [IGNORE] * len(piece_ids))
        state = OK
        if len(ids) > sequence_len:
            if truncation == "drop":
                ids, labels, state = [], [], TOO_LONG
            elif split_long:
                for start in range(0, len(ids), sequence_len):
                    piece, piece_labels = ids[start:start + sequence_len], labels[start:start + sequence_len]
                    if len(piece) > 1:  # a 1-token tail predicts nothing
                        out_ids.append(piece)
                        out_labels.append(piece_labels)
                        status.append(SPLIT)
                continue
            else:
                ids, labels, state = ids[:sequence_len], labels[:sequence_len], TRUNCATED
        if state != TOO_LONG and all(x == IGNORE for x in labels[1:]):
            ids, labels, state = [], [], NO_TARGET  # nothing to learn (e.g. the answer was cut off)
        out_ids.append(ids)
        out_labels.append(labels)
        status.append(state)
    return {"input_ids": out_ids, "labels": out_labels, "status": status}


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of many texts, no special tokens added. Fast tokenizers go straight to their Rust
    backend (the same ids, without building attention masks nobody reads)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def prepare_lm_data(recipe, tokenizer, *, base_dir: Path | None, locate: Locate = _no_location,
                    use_cache: bool = True) -> LMData:
    """Tokenized training (and eval) data of a pretrain/SFT recipe, from the cache when possible.

    A cache entry is built under a lock of its own (``.<fingerprint>.lock`` next to it): processes
    asking for the same entry at once wait for the first one and then read what it wrote."""
    data = recipe.data
    fp = data_fingerprint(recipe, tokenizer, base_dir=base_dir, locate=locate)
    root = Path(data.cache_dir).expanduser() if data.cache_dir else default_cache_root()
    path = root / "tokenized" / fp
    if not use_cache:
        return _build(recipe, tokenizer, fp, path, base_dir=base_dir, locate=locate, use_cache=False)
    hit = _cache_hit(path)
    if hit is not None:
        return hit
    from recipeforge.components.file_lock import exclusive

    with exclusive(path.parent / f".{fp}.lock"):
        hit = _cache_hit(path)  # built by another process while this one waited
        if hit is not None:
            return hit
        _set_aside_broken(path)
        return _build(recipe, tokenizer, fp, path, base_dir=base_dir, locate=locate, use_cache=True)


def _cache_hit(path: Path) -> LMData | None:
    if not (path / "stats.json").is_file():
        return None
    loaded = _load_cached(path)
    if loaded is not None:
        loaded.stats["cache"] = "hit"
    return loaded


def _set_aside_broken(path: Path) -> None:
    """Remove an unreadable cache entry (a copy damaged on disk, or left by an older version) so the
    rebuilt one can take its place; called under the entry's lock."""
    if not path.exists():
        return
    aside = path.with_name(f".{path.name}.broken-{os.getpid()}")
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _build(recipe, tokenizer, fp: str, path: Path, *, base_dir: Path | None, locate: Locate,
           use_cache: bool) -> LMData:
    """Tokenize (and pack) the recipe's data; with `use_cache`, write it to the cache entry `path`.

    Samples go to Arrow files in a work folder as they are made and are read back memory-mapped
    (`lm_store`), so memory holds a chunk of tokens at a time, however large the corpus; the cache
    entry is written from them, and the work folder removed."""
    work = _work_folder(path, use_cache)
    try:
        result = _tokenize_and_pack(recipe, tokenizer, fp, path if use_cache else None, work,
                                    base_dir=base_dir, locate=locate)
        if use_cache:
            _save_cached(result, path)
            result.stats["cache"] = "miss"
        return result
    finally:
        if use_cache:
            shutil.rmtree(work, ignore_errors=True)


def _work_folder(path: Path, use_cache: bool) -> Path:
    """Where the samples are written while they are made: beside the cache entry (the same disk, under
    its lock), or without a cache a temporary folder kept until this process ends (the returned
    datasets are memory-mapped from it)."""
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{path.name}-work-", dir=path.parent))
    folder = Path(tempfile.mkdtemp(prefix="recipeforge-samples-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _tokenize_and_pack(recipe, tokenizer, fp: str, path: Path | None, work: Path, *, base_dir: Path | None,
                       locate: Locate) -> LMData:
    """The tokenized (and packed) train and eval sets, their samples in Arrow files under `work`."""
    data = recipe.data
    spec = stage_spec(recipe.stage)
    t0 = time.perf_counter()
    # Pretraining keeps all of a long document (as consecutive samples); SFT rows are cut or dropped.
    options = EncodeOptions(train_on_inputs=data.train_on_inputs or not spec.masks_inputs,
                            sequence_len=data.sequence_len, truncation=data.truncation,
                            split_long=spec.splits_long_rows,
                            eot_tokens=tuple(getattr(recipe.model, "eot_tokens", ())))
    counts = {"truncated": 0, "split_samples": 0, "dropped_too_long": 0, "dropped_no_target": 0}
    files = itertools.count()

    def transform(ds, fmt):
        if fmt.kind != "lm":
            raise RecipeError(f"format '{fmt.name}' cannot be tokenized for stage {recipe.stage}")
        import numpy as np

        sink = SampleFile(work / f"tokenized-{next(files)}.arrow")
        _, status = encode_dataset(ds, fmt, tokenizer, options, num_proc=data.num_proc, sink=sink.write)
        found = np.bincount(status, minlength=SPLIT + 1) if len(status) else np.zeros(SPLIT + 1, dtype=np.int64)
        if len(status) and not (found[OK] or found[TRUNCATED] or found[SPLIT]):
            raise _nothing_left(status.tolist(), data)
        counts["truncated"] += int(found[TRUNCATED])
        counts["split_samples"] += int(found[SPLIT])
        counts["dropped_too_long"] += int(found[TOO_LONG])
        counts["dropped_no_target"] += int(found[NO_TARGET])
        # A fingerprint of its own: `datasets` would hash every token to make one.
        return sink.dataset(derived_fingerprint(ds, f"tokenized:{fp}"))

    train, evaluation, stats = load_split(data, ("lm",), seed=recipe.train.seed, base_dir=base_dir,
                                          transform=transform, locate=locate)
    stats.update(counts)
    lengths = row_lengths(train)
    stats["train_tokens"] = int(lengths.sum())
    if data.packing:
        train, pstats, stats["trained_tokens"] = _packed(train, lengths, data.sequence_len, work, f"{fp}-train")
        stats.update(packed_sequences=pstats.sequences, packing_efficiency=round(pstats.efficiency, 4))
        if evaluation is not None:
            evaluation = _packed(evaluation, None, data.sequence_len, work, f"{fp}-eval")[0]
    else:
        stats["trained_tokens"] = trained_tokens(train)
    stats["preprocess_seconds"] = round(time.perf_counter() - t0, 3)
    stats["tokens_per_second"] = round(stats["train_tokens"] / max(stats["preprocess_seconds"], 1e-9))
    return LMData(train, evaluation, bool(data.packing), stats, fp, path)


def _packed(ds, lengths, capacity: int, work: Path, name: str):
    """`ds` packed into sequences of `capacity` tokens (`lm_store.pack_to_disk`), memory-mapped from
    `work`; with the packing stats and the trained tokens."""
    out = SampleFile(work / f"{name}-packed.arrow")
    stats, trained = pack_to_disk(ds, capacity, out, lengths)
    return out.dataset(f"{name}-packed"), stats, trained


def _nothing_left(status: list, data) -> RecipeError:
    """Every row of a dataset was filtered out: say by which rule, with the counts."""
    too_long, no_target = status.count(TOO_LONG), status.count(NO_TARGET)
    parts = []
    if too_long:
        parts.append(f"{too_long} longer than data.sequence_len ({data.sequence_len} tokens) with data.truncation: drop")
    if no_target:
        parts.append(f"{no_target} with no target tokens left to train on (the response is empty, or cut off by "
                     "truncation)")
    fixes = ["raise data.sequence_len"] + (["set data.truncation: truncate"] if too_long else []) + \
        (["check that the response column is filled"] if no_target else [])
    return RecipeError(f"all {len(status)} rows were dropped: " + "; ".join(parts),
                       hint=", ".join(fixes[:-1]) + f" or {fixes[-1]}" if len(fixes) > 1 else fixes[0])


def _save_cached(result: LMData, path: Path) -> None:
    """Write the tokenized sets atomically: a half-written cache entry is never picked up."""
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    datasets.disable_progress_bars()
    try:
        result.train.save_to_disk(str(tmp / "train"))
        if result.eval is not None:
            result.eval.save_to_disk(str(tmp / "eval"))
        meta = {"packed": result.packed, "stats": result.stats, "fingerprint": result.fingerprint}
        (tmp / "stats.json").write_text(json.dumps(meta, indent=2))
        try:
            os.replace(tmp, path)
        except OSError:
            if not path.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race; theirs is as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        datasets.enable_progress_bars()
    result.train = datasets.load_from_disk(str(path / "train"))  # memory-mapped from the cache
    if result.eval is not None:
        result.eval = datasets.load_from_disk(str(path / "eval"))


def _load_cached(path: Path) -> LMData | None:
    import datasets

    try:
        meta = json.loads((path / "stats.json").read_text())
        train = datasets.load_from_disk(str(path / "train"))
        evaluation = datasets.load_from_disk(str(path / "eval")) if (path / "eval").exists() else None
    except (OSError, ValueError, json.JSONDecodeError):
        return None  # unreadable entry: rebuild it
    return LMData(train, evaluation, meta["packed"], dict(meta["stats"]), meta["fingerprint"], path)
