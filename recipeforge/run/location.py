"""What refuses a run before its directory is touched: the services it names, and where it would write."""

from __future__ import annotations

from pathlib import Path

from recipeforge.components.data import DatasetRef, resolve_local, spec_base_dir
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs.preflight import check_output_location, planned_output
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.resolved import DATA_SECTIONS


def refuse_before_writing(loaded: LoadedRecipe, plan: Plan, run: RunDir, *, overwrite: bool) -> None:
    """Everything that can refuse the run does so before the run directory is touched: the services the
    recipe names (trackers, the Hub, a generation server) and the packages its trackers need, then whether
    its location can and may be written (data paths resolved, so a folder inside a dataset is refused)."""
    from recipeforge.outputs.services import check_services
    from recipeforge.outputs.trackers import check_installed

    check_installed(loaded.recipe, loaded.tree.locate)  # before the model loads, not once it is loaded
    check_services(loaded.recipe, loaded.tree.locate)
    check_location(loaded, plan, run, overwrite=overwrite)


def check_location(loaded: LoadedRecipe, plan: Plan, run: RunDir, *, overwrite: bool) -> None:
    """Refuse an output location the run cannot or must not write, before anything is written there."""
    base = Path(loaded.path).resolve().parent
    data = []
    for section in DATA_SECTIONS:
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            ref = DatasetRef(spec, section, i)
            if any(ch in spec.path for ch in "*?["):  # a glob of stream shards: the folder its pattern starts in
                found = _glob_root(spec.path, spec_base_dir(ref, base, loaded.tree.locate))
            else:
                found = resolve_local(ref, base_dir=base, locate=loaded.tree.locate)
            if found is not None:
                data.append((ref.key, found))
    check_output_location(run.root, recipe_path=Path(loaded.path), datasets=data, overwrite=overwrite,
                          planned=planned_output(plan, loaded.recipe), log=log)


def _glob_root(pattern: str, base: Path | None) -> Path | None:
    """The existing folder a glob pattern's fixed part names (``shards/part-*.jsonl`` -> shards/), or None."""
    import glob

    fixed = Path(pattern.split("*")[0].split("?")[0].split("[")[0] or ".").expanduser()
    folder = fixed if str(pattern).endswith("/") or fixed.is_dir() else fixed.parent
    if not folder.is_absolute() and base is not None:
        folder = base / folder
    if not glob.has_magic(str(folder)) and folder.is_dir():
        return folder.resolve()
    return None
