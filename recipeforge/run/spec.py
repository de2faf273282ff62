"""The worker spec a launching command writes: its recipe, overrides and settings, as its workers get them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from recipeforge.backends.worker_spec import WorkerSpec
from recipeforge.config.overrides import ENV_PREFIX
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.run.options import LaunchOptions
from recipeforge.settings import Settings, current


def spec_for(loaded: LoadedRecipe, opts: LaunchOptions, *, plan_path: Path, run_dir: Path, outcome: Path | None,
             recipe_path: str | None = None) -> WorkerSpec:
    """The spec of a run of `loaded` started as `opts` says (`outcome` None: trained in this process)."""
    return WorkerSpec(plan=str(Path(plan_path).absolute()), run_dir=str(Path(run_dir).absolute()),
                      outcome=str(Path(outcome).absolute()) if outcome is not None else None,
                      recipe=str(Path(recipe_path or opts.recipe_path or loaded.path).absolute()),
                      overrides=tuple(opts.overrides), recipe_env=recipe_env(), settings=launch_settings(opts))


def launch_settings(opts: LaunchOptions) -> Settings:
    """This command's settings, with the flags a library caller gave in `opts` added."""
    here = current()
    trusted = here.trust_code or opts.trust_code
    return replace(here, debug=here.debug or opts.debug, verbose=here.verbose or opts.verbose, trust_code=trusted,
                   trust_source=here.trust_source or ("--trust-code" if opts.trust_code else ""))


def recipe_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``RECIPEFORGE_<SECTION>[__<KEY>]`` variables the recipe loader applied here (`config.overrides`),
    which the workers apply from their spec instead of reading their environment."""
    from recipeforge.config.schema import Recipe

    env = os.environ if environ is None else environ
    sections = set(Recipe.model_fields)
    return {name: value for name, value in env.items()
            if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):].lower().split("__")[0] in sections}
