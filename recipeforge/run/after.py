"""After a run is trained, in the launching process: the backend's last step, evaluation and the push to the Hub."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge import start_up
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log

if TYPE_CHECKING:
    from recipeforge.backends.base import Backend
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.types import Plan


def finish_run(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend | None = None) -> None:
    """The main node once every worker is done: the backend's step after the job (Megatron exports
    final/), evaluation (`eval.after_training`), then the push to the Hub."""
    start_up.resume()  # a run that trained nothing here (restarted after it finished) never resumed it
    if backend is not None:
        backend.finish_launch(loaded, plan, run, log=log)
    evaluate_after_training(loaded, run.root)
    push_to_hub(loaded, run.root)


def evaluate_after_training(loaded: LoadedRecipe, run_root: Path) -> None:
    """`eval.tasks` with `eval.after_training`: evaluate the saved model (`tools.evaluation`) before it
    is pushed, so the card uploaded holds the scores. A user error (lm-eval missing, a bad task) is
    logged and leaves the run complete: `recipeforge eval RUN_DIR` retries."""
    section = loaded.recipe.eval
    if not section.tasks or not section.after_training:
        return
    from recipeforge.errors import RecipeError
    from recipeforge.tools.evaluation.command import options_for, refresh_card
    from recipeforge.tools.evaluation.runner import evaluate_run

    options = options_for(section.model_dump(), batch_size=None, limit=None, device=None)
    _free_training_memory()
    from recipeforge.outputs.merge import whole_model_loading

    try:
        with whole_model_loading():  # a ZeRO-3 worker's process: the model loads whole, without its peers
            done = evaluate_run(run_root, list(section.tasks), Path(loaded.path).resolve().parent, options,
                                log=log, checkpoints=section.at_checkpoints, allow_code=loaded.recipe.allow_code,
                                key="eval.tasks")
    except RecipeError as exc:
        import shlex

        from recipeforge.registry import code_trust

        # The retry runs the same tasks with the same trust: --trust-code when this run had it by flag.
        trust = ["--trust-code"] if code_trust(False)[0] else []
        again = shlex.join(["recipeforge", *trust, "eval", str(run_root),
                            *(["--checkpoints"] if section.at_checkpoints else [])])
        log(f"warning: evaluation skipped: {exc.render()}\n  the run is complete; evaluate it with: {again}")
        return
    refresh_card(run_root)
    for subject, records in done.items():
        for name, record in records.items():
            log(f"eval {subject} {name}: " + ", ".join(f"{k} {v}" for k, v in record["scores"].items()))


def _free_training_memory() -> None:
    """A run trained in this process leaves its trainer (model, optimizer states) to the collector:
    collected before the model is loaded again for evaluation, and the GPU's cached blocks released."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def push_to_hub(loaded: LoadedRecipe, run_root: Path) -> None:
    """`output.push_to_hub`: upload the saved model once the run is complete (`tools.hub`). A failed
    upload raises `tools.hub.PushFailed`; the run directory is already complete then."""
    hub = loaded.recipe.output.push_to_hub
    if hub is None:
        return
    from recipeforge.tools.hub import push

    log(f"pushing the model to the Hub: {hub.repo_id}")
    log(f"pushed: {push(run_root, hub.repo_id, private=hub.private, log=log)}")
