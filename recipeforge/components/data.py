"""Reading datasets: local files or hub ids, column remapping, mixing, the held-out split.

Every problem a user can cause (a missing file, a missing column, an empty dataset) becomes a
`RecipeError` at the recipe key that names the dataset.
"""

from __future__ import annotations

import collections
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from recipeforge.components.data_files import check_jsonl, is_blank, load_hint, read_file
from recipeforge.components.formats import Format, RenderOptions, get_format
from recipeforge.errors import Location, Problem, RecipeError

# File suffix -> `datasets` builder.
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
                  ".arrow": "arrow"}

Locate = Callable[[tuple], Optional[Location]]


def _no_location(path: tuple) -> None:
    return None


@dataclass(frozen=True)
class DatasetRef:
    """A dataset entry of the recipe and where it is written."""

    spec: Any              # config.schema.DatasetSpec
    section: str           # "datasets" | "eval_datasets"
    index: int

    @property
    def key(self) -> str:
        return f"data.{self.section}[{self.index}]"

    @property
    def path_key(self) -> tuple:
        return ("data", self.section, self.index)


def local_path(path: str, base_dir: Path | None) -> Path | None:
    """The local file or directory `path` names (relative to the recipe's folder, then to the working
    directory), or None when it is not a local path."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [base_dir / p] if base_dir else []
    if not p.is_absolute():
        candidates.append(Path.cwd() / p)
    for c in candidates:
        if c.exists():
            return c.resolve()
    return None


def looks_local(path: str) -> bool:
    """Whether a path that does not exist was meant as a local file (rather than a hub id)."""
    return (Path(path).suffix.lower() in LOCAL_BUILDERS or path.startswith((".", "/", "~"))
            or path.count("/") > 1 or os.sep != "/" and os.sep in path)


def spec_base_dir(ref: DatasetRef, base_dir: Path | None, locate: Locate = _no_location) -> Path | None:
    """The folder a dataset's relative path starts from: that of the recipe file that wrote the
    path (a parent recipe, for a path written there), else `base_dir`."""
    where = locate(ref.path_key + ("path",))
    if where is not None and where.file and not where.file.startswith("<"):
        return Path(where.file).parent
    return base_dir


def resolve_local(ref: DatasetRef, *, base_dir: Path | None, locate: Locate = _no_location) -> Path | None:
    """The local file or directory a dataset entry names, None for a hub id; a path that looks local
    but does not exist is an error (checked before a run writes anything)."""
    spec = ref.spec
    base_dir = spec_base_dir(ref, base_dir, locate)
    found = local_path(spec.path, base_dir)
    if found is None and looks_local(spec.path):
        tried = [str(base_dir / spec.path)] if base_dir and not Path(spec.path).is_absolute() else []
        tried.append(str(Path(spec.path).expanduser().absolute()))
        raise RecipeError(f"data file '{spec.path}' not found (looked at {' and '.join(dict.fromkeys(tried))})",
                          key=f"{ref.key}.path", location=locate(ref.path_key + ("path",)),
                          hint="paths are relative to the recipe file's folder or the working directory")
    return found


def load_raw(ref: DatasetRef, *, base_dir: Path | None, locate: Locate = _no_location):
    """The rows of one dataset entry as a `datasets.Dataset` (columns not yet renamed)."""
    import datasets

    spec = ref.spec
    where = locate(ref.path_key + ("path",))
    found = resolve_local(ref, base_dir=base_dir, locate=locate)
    datasets.disable_progress_bars()  # our own log line reports rows; per-file bars are noise
    no_telemetry()
    try:
        if found is not None and found.is_file():
            builder = LOCAL_BUILDERS.get(found.suffix.lower())
            if builder is None:
                raise RecipeError(f"unsupported data file type '{found.suffix}' ({found})", key=f"{ref.key}.path",
                                  location=where, hint=f"use one of {', '.join(sorted(LOCAL_BUILDERS))}")
            if is_blank(found):
                raise RecipeError(f"dataset '{spec.path}' has no rows (the file is empty)", key=f"{ref.key}.path",
                                  location=where)
            if found.suffix.lower() == ".jsonl":
                check_jsonl(found, spec.path, key=f"{ref.key}.path", location=where)
            ds = read_file(found, builder)
        elif found is not None:
            ds = datasets.load_dataset(str(found), name=spec.name, split=spec.split)
        else:
            ds = datasets.load_dataset(spec.path, name=spec.name, split=spec.split)
    except RecipeError:
        raise
    except Exception as exc:  # datasets raises many types; all mean "could not read this dataset"
        raise RecipeError(f"cannot read dataset '{spec.path}': {_first_line(exc)}", key=f"{ref.key}.path",
                          location=where, hint=load_hint(spec, found)) from None
    finally:
        datasets.enable_progress_bars()
    if isinstance(ds, datasets.DatasetDict):  # a directory with several splits and no split chosen
        raise RecipeError(f"dataset '{spec.path}' has splits {list(ds)}; choose one", key=f"{ref.key}.split",
                          location=where)
    if len(ds) == 0:
        raise RecipeError(f"dataset '{spec.path}' has no rows", key=f"{ref.key}.path", location=where)
    return ds


def no_telemetry() -> None:
    """`datasets` reports every `load_dataset` call to a download counter online unless told not to;
    its flag is read at call time."""
    import datasets

    os.environ["HF_UPDATE_DOWNLOAD_COUNTS"] = "false"
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False


def remap_and_check(ds, ref: DatasetRef, fmt: Format, *, locate: Locate = _no_location):
    """Rename columns as `columns:` says, then check the format's required columns are there."""
    spec = ref.spec
    where = locate(ref.path_key + ("columns",)) or locate(ref.path_key)
    found = list(ds.column_names)
    renames = {}
    for target, source in spec.columns.items():
        if source not in found:
            raise RecipeError(f"column '{source}' (mapped to '{target}') not found in '{spec.path}'; "
                              f"columns found: {', '.join(found)}", key=f"{ref.key}.columns.{target}",
                              location=where)
        if source != target:
            renames[source] = target
    if renames:
        clash = [t for t in renames.values() if t in found and t not in renames]
        if clash:  # renaming onto an existing column: drop the old one first
            ds = ds.remove_columns(clash)
        ds = ds.rename_columns(renames)
    present = set(ds.column_names)
    missing = [c for c in fmt.required if c not in present]
    if missing and not (fmt.name == "preference" and missing == ["prompt"]):
        raise RecipeError(
            f"format '{fmt.name}' needs column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}, "
            f"not found in '{spec.path}'; columns found: {', '.join(found)}",
            key=f"{ref.key}.format", location=locate(ref.path_key + ("format",)),
            hint=f"map your columns, e.g. columns: {{{missing[0]}: <your column>}}")
    return ds


def apply_prompt(ds, ref: DatasetRef, fmt: Format, *, locate: Locate = _no_location) -> tuple[Any, Format]:
    """`remap_and_check`, then for a dataset with a text prompt (`prompt:`) its rows rendered to
    prompt/completion columns, which the `completion` format tokenizes (the prompt untrained, the reply
    and EOS trained), and for a preference or unpaired dataset with `texts:` its prompt and answers
    written as text; returns the rows and the format that tokenizes them."""
    texts = getattr(ref.spec, "texts", None)
    if texts is not None:  # preference/unpaired rows written as text: the texts read the columns
        import dataclasses

        from recipeforge.components.row_texts import required_columns, text_names, to_text_rows

        made = text_names(fmt.kind)
        required = required_columns(texts, fmt.kind) + tuple(c for c in fmt.required if c not in made)
        ds = remap_and_check(ds, ref, dataclasses.replace(fmt, required=required), locate=locate)
        return to_text_rows(ds, texts, fmt.kind, key=ref.key, path=ref.spec.path,
                            where=locate(ref.path_key + ("texts",))), fmt
    prompt = getattr(ref.spec, "prompt", None)
    if prompt is None:
        return remap_and_check(ds, ref, fmt, locate=locate), fmt
    import dataclasses

    from recipeforge.components.text_prompt import columns, to_completion_rows

    required, _ = columns(prompt)
    ds = remap_and_check(ds, ref, dataclasses.replace(fmt, required=required), locate=locate)
    ds = to_completion_rows(ds, prompt, key=ref.key, where=locate(ref.path_key + ("prompt",)))
    return ds, get_format("completion")


def effective_format(spec) -> Format:
    """The format that tokenizes a dataset's rows: `completion` for one with a text prompt, else its own."""
    return get_format("completion") if getattr(spec, "prompt", None) is not None else get_format(spec.format)


MIX_SOURCE = "_mix_source"


def mix(parts: list, weights: list[float], seed: int, stopping: str = "all_exhausted") -> tuple[Any, list[int]]:
    """Mix datasets by sampling: each row is drawn from dataset i with probability weights[i] / sum.

    `stopping` says when the mix (one epoch) ends: `all_exhausted` once every row of every dataset
    was drawn (datasets that run out start over), `first_exhausted` once one dataset runs out. The
    draw is seeded, so a recipe mixes the same rows in the same order every time. Returns the mixed
    dataset and the number of its rows from each dataset.
    """
    import datasets

    total = float(sum(weights))
    probabilities = [w / total for w in weights]
    tagged = [p.add_column(MIX_SOURCE, [i] * len(p)) for i, p in enumerate(parts)]
    try:
        mixed = datasets.interleave_datasets(tagged, probabilities=probabilities, seed=seed,
                                             stopping_strategy=stopping)
    except ValueError:  # different column types: align on the shared columns
        mixed = datasets.interleave_datasets(_shared_columns(tagged), probabilities=probabilities, seed=seed,
                                             stopping_strategy=stopping)
    counts = collections.Counter(mixed[MIX_SOURCE])
    return mixed.remove_columns(MIX_SOURCE), [counts.get(i, 0) for i in range(len(parts))]


def load_split(data, stage_kinds: tuple[str, ...], *, seed: int, base_dir: Path | None,
               transform: Callable[[Any, Format], Any], locate: Locate = _no_location) -> tuple[Any, Any, dict]:
    """Train and eval rows of a `data:` section: read, renamed, transformed, mixed and split.

    `transform(dataset, format)` turns each dataset into the stage's common columns (token ids, or
    the TRL layout) before datasets of different formats are concatenated. While it runs, each row
    has ``_format`` (its dataset's format) and ``_row`` (its 1-based row number in its source).
    Returns (train, eval or None, stats).
    """
    import datasets

    reader = _SplitReader(data, stage_kinds, seed=seed, base_dir=base_dir, transform=transform, locate=locate)
    stats: dict[str, Any] = {}
    train_parts = reader.read("datasets", data.datasets)
    evaluation = None
    if data.eval_datasets:
        evaluation = _concat(reader.read("eval_datasets", data.eval_datasets))
    elif data.val_size:
        train_parts, eval_parts = _hold_out(train_parts, data.val_size, seed, locate)
        evaluation = _concat(eval_parts)
    if len(train_parts) > 1 and any(s.weight is not None for s in data.datasets):
        weights = [1.0 if s.weight is None else s.weight for s in data.datasets]
        train, stats["train_rows_by_dataset"] = mix(train_parts, weights, seed, data.mix_stopping)
    else:  # no weights (or one dataset): every row once per epoch
        train = _concat(train_parts)
    stats["train_rows"] = len(train)
    if data.dedup or any(getattr(s, "dedup", None) for s in data.datasets):
        stats["duplicates_dropped"] = reader.dropped_duplicates
    stats["eval_rows"] = len(evaluation) if evaluation is not None else 0
    assert isinstance(train, datasets.Dataset)
    return train, evaluation, stats


class _SplitReader:
    """Reads the datasets of one `data:` section for `load_split`, one at a time: format, columns,
    duplicates, sample cap, the stage's transform. It keeps what spans datasets: the row digests seen
    so far (``data.dedup`` compares across datasets) and how many duplicates were dropped."""

    def __init__(self, data, stage_kinds: tuple[str, ...], *, seed: int, base_dir: Path | None,
                 transform: Callable[[Any, Format], Any], locate: Locate):
        self.data, self.stage_kinds, self.seed, self.base_dir = data, stage_kinds, seed, base_dir
        self.transform, self.locate = transform, locate
        self.seen: set[bytes] = set()  # row digests of the training rows so far (data.dedup: across datasets)
        self.dropped_duplicates = 0

    def read(self, section: str, specs) -> list:
        """The datasets of `section` ("datasets" or "eval_datasets"), each ready to concatenate."""
        return [self._read_one(DatasetRef(spec, section, i)) for i, spec in enumerate(specs)]

    def _read_one(self, ref: DatasetRef):
        """One dataset entry, read and transformed; refused when no row is left."""
        spec, locate = ref.spec, self.locate
        fmt = self._format(ref)
        ds, fmt = self._columns(ref, fmt)
        ds = self._dedup(ds, ref)
        if spec.max_samples and spec.max_samples < len(ds):
            ds = ds.shuffle(seed=self.seed).select(range(spec.max_samples))
        ds = self._transform(ds, ref, fmt)
        if len(ds) == 0:
            raise RecipeError(f"dataset '{spec.path}' has no usable rows", key=f"{ref.key}.path",
                              location=locate(ref.path_key + ("path",)),
                              hint="check data.sequence_len and data.truncation (rows may all be too long)")
        return ds

    def _format(self, ref: DatasetRef) -> Format:
        """The dataset's format, which must be one this stage trains on."""
        fmt = get_format(ref.spec.format, key=f"{ref.key}.format", location=self.locate(ref.path_key + ("format",)))
        if fmt.kind not in self.stage_kinds:
            raise RecipeError(f"format '{fmt.name}' does not fit this stage", key=f"{ref.key}.format",
                              location=self.locate(ref.path_key + ("format",)))
        return fmt

    def _columns(self, ref: DatasetRef, fmt: Format) -> tuple[Any, Format]:
        """The raw rows in the format's columns, with ``_row`` and ``_format`` added, and the format that
        tokenizes them (`apply_prompt`)."""
        spec, locate = ref.spec, self.locate
        ds = load_raw(ref, base_dir=self.base_dir, locate=locate)
        if getattr(spec, "messages", None) is not None:  # field mappings: to OpenAI messages first
            from recipeforge.components.messages import apply_message_fields

            ds = apply_message_fields(ds, spec.messages, key=f"{ref.key}.messages",
                                      where=locate(ref.path_key + ("messages",)))
        ds, fmt = apply_prompt(ds, ref, fmt, locate=locate)
        keep = None if fmt.kind == "prompt" else [c for c in ds.column_names if c in fmt.required + fmt.optional]
        if keep is not None:
            ds = ds.select_columns(keep)
        # Fingerprints derived from the dataset's own: `datasets` would otherwise hash both new columns.
        ds = ds.add_column("_row", list(range(1, len(ds) + 1)), new_fingerprint=derived_fingerprint(ds, "_row"))
        return ds.add_column("_format", [fmt.name] * len(ds), new_fingerprint=derived_fingerprint(ds, fmt.name)), fmt

    def _dedup(self, ds, ref: DatasetRef):
        """Training rows without duplicates, when the dataset or the data section asks for it."""
        spec, data = ref.spec, self.data
        dedup = spec.dedup if getattr(spec, "dedup", None) is not None else getattr(data, "dedup", False)
        if ref.section != "datasets" or not dedup:
            return ds
        from recipeforge.components.dedup import drop_duplicates

        # A dataset's own `dedup: true` compares its rows among themselves; `data.dedup` across datasets.
        ds, n = drop_duplicates(ds, self.seen if getattr(data, "dedup", False) else set())
        self.dropped_duplicates += n
        return ds

    def _transform(self, ds, ref: DatasetRef, fmt: Format):
        """The stage's transform, its row problems said with the dataset they are in."""
        try:
            return self.transform(ds, fmt)
        except RecipeError as exc:  # row problems: say which dataset the row is in
            where = self.locate(ref.path_key + ("path",))
            raise RecipeError([Problem(f"{ref.spec.path}: {p.message}" if p.key is None else p.message,
                                       p.location or where, p.key or ref.key, p.hint)
                               for p in exc.problems]) from None


def derived_fingerprint(ds, step: str) -> str:
    """A `datasets` fingerprint for `ds` after `step`, derived from its own (deterministic, no hashing of rows)."""
    import hashlib

    return hashlib.sha256(f"{ds._fingerprint}:{step}".encode()).hexdigest()[:16]


def _hold_out(parts: list, val_size, seed: int, locate: Locate) -> tuple[list, list]:
    """Split every dataset in proportion to its size, before the weighted mix draws any row (no eval row is
    ever also a training row)."""
    total = sum(len(p) for p in parts)
    n_eval = int(val_size) if isinstance(val_size, int) else max(1, math.ceil(float(val_size) * total))
    if n_eval >= total:
        raise RecipeError(f"val_size {val_size} leaves no training rows ({total} rows in all)",
                          key="data.val_size", location=locate(("data", "val_size")))
    train_parts, eval_parts = [], []
    left = n_eval
    for i, p in enumerate(parts):
        n = left if i == len(parts) - 1 else min(left, round(n_eval * len(p) / total))
        left -= n
        if n == 0:
            train_parts.append(p)
            continue
        if n >= len(p):
            raise RecipeError(f"val_size {val_size} takes every row of data.datasets[{i}]",
                              key="data.val_size", location=locate(("data", "val_size")))
        split = p.train_test_split(test_size=n, seed=seed, shuffle=True)
        train_parts.append(split["train"])
        eval_parts.append(split["test"])
    return train_parts, eval_parts


def _concat(parts: list):
    import datasets

    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError:  # different column types: align on the shared columns
        return datasets.concatenate_datasets(_shared_columns(parts))


def _shared_columns(parts: list) -> list:
    """Each dataset reduced to the columns all of them have."""
    common = set.intersection(*(set(p.column_names) for p in parts))
    return [p.select_columns(sorted(common)) for p in parts]


def format_rows(ds, opts: RenderOptions):
    """Rows of preference/prompt datasets in the layout the TRL trainers read (DPO and GRPO)."""
    def convert(row):
        fmt = get_format(row["_format"])
        try:
            out = fmt.render(row, opts)
        except RecipeError as exc:
            raise RecipeError(f"row {row['_row']}: {exc}") from None
        except (KeyError, TypeError) as exc:
            raise RecipeError(f"row {row['_row']} of a '{fmt.name}' dataset is malformed: {exc}") from None
        for col in fmt.required:
            if out.get(col) in (None, ""):
                raise RecipeError(f"row {row['_row']}: column '{col}' is empty")
        return out

    import datasets

    datasets.disable_progress_bars()
    try:
        out = ds.map(convert)
    finally:
        datasets.enable_progress_bars()
    return out.remove_columns([c for c in ("_format", "_row") if c in out.column_names])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def truncate_prompts(ds, tokenizer, max_tokens: int):
    """Keep the last `max_tokens` tokens of each plain-text prompt (the end holds the question).

    Returns (dataset, number of prompts cut). Conversational prompts are left as they are.
    """
    cut = 0

    def shorten(batch):
        nonlocal cut
        prompts = batch["prompt"]
        texts = [p for p in prompts if isinstance(p, str)]
        if not texts:
            return batch
        ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"])
        out = []
        for p in prompts:
            if not isinstance(p, str):
                out.append(p)
                continue
            tokens = next(ids)
            if len(tokens) > max_tokens:
                cut += 1
                p = tokenizer.decode(tokens[-max_tokens:])
            out.append(p)
        return {**batch, "prompt": out}

    import datasets

    datasets.disable_progress_bars()
    try:
        out = ds.map(shorten, batched=True, load_from_cache_file=False)
    finally:
        datasets.enable_progress_bars()
    return out, cut
