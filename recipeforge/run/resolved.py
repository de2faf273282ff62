"""The recipe as a run used it, written into its run directory and read back by its later steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipeforge.components.data import DatasetRef, local_path, spec_base_dir
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.outputs.run_dir import RunDir

DATA_SECTIONS = ("datasets", "eval_datasets")


def resolved_for_run(loaded: LoadedRecipe, run: RunDir) -> dict[str, Any]:
    """The recipe as the run used it: every default filled in, secrets redacted, local data paths made
    absolute and `output.dir` pinned, so ``recipeforge train RUN/resolved_recipe.yaml`` works from
    anywhere and continues this run."""
    from recipeforge.components.chat_templates import is_template_path, template_file
    from recipeforge.config.dump import resolved_data

    data = resolved_data(loaded)
    base = Path(loaded.path).resolve().parent
    for section in DATA_SECTIONS:
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            found = local_path(spec.path, spec_base_dir(DatasetRef(spec, section, i), base, loaded.tree.locate))
            if found is not None:
                data["data"][section][i]["path"] = str(found)
    template = loaded.recipe.data.chat_template
    if is_template_path(template):  # a .jinja file next to the recipe: absolute, like the data paths
        found = template_file(template, base_dir=base, location=loaded.tree.locate(("data", "chat_template")))
        if found is not None:
            data["data"]["chat_template"] = str(found)
    data["eval"]["tasks"] = [_local_task_path(task, base) for task in loaded.recipe.eval.tasks]
    data["output"]["dir"] = str(run.root)
    return data


def _local_task_path(task: str, base: Path) -> str:
    """A local eval task file (relative to the recipe) made absolute, like the data paths; a harness task
    name as it is."""
    from recipeforge.tools.evaluation.tasks import is_local

    path = Path(task).expanduser()
    if not is_local(task) or path.is_absolute() or not (base / path).is_file():
        return task
    return str((base / path).resolve())
