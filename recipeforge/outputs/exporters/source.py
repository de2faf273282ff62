"""What an export starts from and where it goes: the run's final/ model (a LoRA adapter merged into
its base first), and an output folder that never replaces anything without --overwrite."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from recipeforge.errors import RecipeError

# Parts of a run an export may never be written over, even with --overwrite: the trained model and
# the base a LoRA adapter needs exist nowhere else.
_PROTECTED = ("final", "base_model")


def check_run_dir(run_dir: Path) -> Path:
    """The run's final/ folder; a `RecipeError` when there is none or it holds no causal LM."""
    final = Path(run_dir) / "final"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        raise RecipeError(f"{run_dir} has no final/ model to export",
                          hint="give the run directory of a finished `recipeforge train` (it writes final/)")
    if _is_classifier(final):
        raise RecipeError(f"{final} is a sequence-classification (reward) model; export writes generative models",
                          hint="use `recipeforge merge` for a LoRA reward model, or final/ as it is")
    return final


def _is_classifier(final: Path) -> bool:
    if (final / "adapter_config.json").is_file():
        return json.loads((final / "adapter_config.json").read_text()).get("task_type") == "SEQ_CLS"
    architectures = json.loads((final / "config.json").read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


def is_adapter(run_dir: Path) -> bool:
    """Whether the run's final/ holds a LoRA adapter rather than full weights."""
    return (Path(run_dir) / "final" / "adapter_config.json").is_file()


def check_output(run_dir: Path, out: Path, *, overwrite: bool) -> None:
    """Refuse an output folder that holds files (unless `overwrite`) or that is, or holds, a part of
    the run that cannot be rebuilt."""
    run_dir, out = Path(run_dir).resolve(), Path(out).resolve()
    guarded = [run_dir, *(run_dir / name for name in _PROTECTED)]
    for part in guarded:
        if out == part or part.is_relative_to(out) or (part != run_dir and out.is_relative_to(part)):
            raise RecipeError(f"cannot export into {out}: it would replace {part}",
                              key="--output", hint="choose another folder with -o DIR")
    if out.exists() and not out.is_dir():
        raise RecipeError(f"{out} exists and is not a folder", key="--output", hint="choose another path with -o DIR")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RecipeError(f"{out} already holds files", key="--output",
                          hint="pass --overwrite to replace them, or -o DIR for another folder")


@contextlib.contextmanager
def full_weights(run_dir: Path, scratch: Path, log: Callable[[str], None] = lambda _: None) -> Iterator[Path]:
    """A folder with the run's full weights and tokenizer: final/ itself, or, for a LoRA run, the
    adapter merged into its base in a temporary folder under `scratch` (removed afterwards)."""
    final = Path(run_dir) / "final"
    if not is_adapter(run_dir):
        yield final
        return
    from recipeforge.outputs.export import merge_adapter

    log("merging the LoRA adapter into its base")
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".merge-", dir=scratch) as tmp:
        yield merge_adapter(Path(run_dir), Path(tmp) / "merged")
