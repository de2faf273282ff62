"""What an export starts from and where it goes: the run's final/ model (a LoRA adapter merged into
its base first), and an output folder that never replaces anything without --overwrite."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from recipeforge.errors import RecipeError

# Parts of a run an export may never be written over, even with --overwrite: the trained model and
# the base a LoRA adapter needs exist nowhere else.
_PROTECTED = ("final", "base_model")


def check_run_dir(run_dir: Path) -> Path:
    """The run's final/ folder; a `RecipeError` when there is none, it is damaged, or it holds no causal LM."""
    from recipeforge.outputs.model_files import check_model_dir

    final = Path(run_dir) / "final"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        raise RecipeError(f"{run_dir} has no final/ model to export",
                          hint="give the run directory of a finished `recipeforge train` (it writes final/)")
    check_model_dir(final)
    if _is_classifier(final):
        raise RecipeError(f"{final} is a sequence-classification (reward) model; export writes generative models",
                          hint="use `recipeforge merge` for a LoRA reward model, or final/ as it is")
    return final


def _is_classifier(final: Path) -> bool:
    from recipeforge.outputs.model_files import read_json_file

    if (final / "adapter_config.json").is_file():
        return read_json_file(final / "adapter_config.json").get("task_type") == "SEQ_CLS"
    architectures = read_json_file(final / "config.json").get("architectures") or []
    return isinstance(architectures, list) and any(str(a).endswith("ForSequenceClassification") for a in architectures)


def is_adapter(run_dir: Path) -> bool:
    """Whether the run's final/ holds a LoRA adapter rather than full weights."""
    return (Path(run_dir) / "final" / "adapter_config.json").is_file()


def check_output(run_dir: Path, out: Path, *, overwrite: bool) -> None:
    """Refuse an output folder that holds files (unless `overwrite`, and then only one recipeforge wrote),
    that is a place never written over (the root, the home or working directory, the run or a folder
    holding it), or that is, or lies in, a part of the run that cannot be rebuilt (`ownership`)."""
    from recipeforge.outputs.ownership import check_replaceable

    run_dir = Path(run_dir).resolve()
    resolved = Path(out).resolve()
    for part in (run_dir / name for name in _PROTECTED):
        if resolved.is_relative_to(part):
            raise RecipeError(f"cannot export into {resolved}: it would replace {part}",
                              key="--output", hint="choose another folder with -o DIR")
    check_replaceable(Path(out), overwrite=overwrite, key="--output",
                      also=[(run_dir, "the run directory being exported")])


@contextlib.contextmanager
def full_weights(run_dir: Path, scratch: Path, log: Callable[[str], None] = lambda _: None) -> Iterator[Path]:
    """A folder with the run's full weights and tokenizer: final/ itself, or, for a LoRA run, the
    adapter merged into its base in a temporary folder under `scratch` (removed afterwards)."""
    final = Path(run_dir) / "final"
    if not is_adapter(run_dir):
        yield final
        return
    from recipeforge.outputs.merge import merge_adapter

    from recipeforge.outputs.ownership import staging_folder

    log("merging the LoRA adapter into its base")
    tmp = staging_folder(scratch, "merge")  # a killed export's leftover is removed by the next one
    try:
        yield merge_adapter(Path(run_dir), tmp / "merged")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
