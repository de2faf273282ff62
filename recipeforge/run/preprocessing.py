"""`recipeforge preprocess`: the tokenized-data cache of a recipe built ahead of training."""

from __future__ import annotations

from typing import Any

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.run.network import network_guards


def preprocess(loaded: LoadedRecipe) -> dict[str, Any]:
    """Build the tokenized-data cache of a pretrain/SFT recipe ahead of training; returns statistics.

    DPO and GRPO data are tokenized by their trainers; for them the rows are read, remapped and
    checked, and their counts returned.
    """
    from recipeforge.components.data_checks import check_data_numbers
    from recipeforge.log import log
    from recipeforge.outputs.services import check_services
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import RecipeContext

    network_guards()
    check_services(loaded.recipe, loaded.tree.locate, downloads_only=True)
    data = runner_class(loaded.recipe.stage)(RecipeContext(loaded=loaded)).prepare()
    check_data_numbers(loaded.recipe, None, data, log=log)  # against the recipe's own global batch
    stats = dict(data.stats)
    if data.cache_path is not None:
        stats["cache_path"] = str(data.cache_path)
        stats["fingerprint"] = data.fingerprint
    return stats
