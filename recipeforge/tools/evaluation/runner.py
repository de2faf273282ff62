"""Run lm-evaluation-harness on a finished run's model and write RUN_DIR/eval/<task>.json.

The model is final/ as `recipeforge chat` loads it (a LoRA adapter on its base, not merged), handed
to lm-eval's HF backend (`HFLM`) as a model object. lm-eval and torch are imported here only.
"""

from __future__ import annotations

import difflib
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import RecipeError
from recipeforge.tools.evaluation.results import EVAL_DIR, fingerprint, split_scores, write_result
from recipeforge.tools.evaluation.tasks import TaskRef, resolve_tasks

if TYPE_CHECKING:
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

# A CPU has no out-of-memory search to lean on and gains little from larger batches: a modest fixed
# batch. On a GPU lm-eval's "auto" starts from the largest batch and halves it until one fits.
CPU_BATCH_SIZE = 8
INSTALL_HINT = "pip install 'recipeforge[eval]' (or pip install lm-eval)"


@dataclass(frozen=True)
class EvalOptions:
    """How the tasks are run (the recipe's `eval:` section, with the command's flags over it)."""

    batch_size: int | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    max_new_tokens: int = 32
    apply_chat_template: bool = False
    device: str | None = None


def require_lm_eval() -> None:
    """A `RecipeError` saying how to install lm-eval when it is missing (its top-level import is light:
    neither torch nor transformers)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise RecipeError("lm-eval (EleutherAI's lm-evaluation-harness) is not installed",
                          hint=INSTALL_HINT) from None


def require_final(run_dir: Path) -> None:
    """A `RecipeError` unless `run_dir` holds a finished model (full weights or an adapter) in final/."""
    final = Path(run_dir) / "final"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        raise RecipeError(f"{run_dir} has no final/ model to evaluate",
                          hint="give the run directory of a finished `recipeforge train` (it writes final/), "
                               "or the recipe of one")


@dataclass(frozen=True)
class Subject:
    """A saved model to evaluate and where its results go: final/ into eval/, a checkpoint into
    eval/<checkpoint name>/."""

    label: str
    model_dir: Path
    out_dir: Path


def subjects(run_dir: Path, *, checkpoints: bool, log: Callable[[str], None] = print) -> list[Subject]:
    """final/ of a run, and with `checkpoints` every complete checkpoint kept in checkpoints/ that holds
    Hugging Face weights or an adapter (a sharded DeepSpeed or FSDP checkpoint does not), oldest first.
    A checkpoint that does not verify (its manifest, its files) is skipped with a warning saying why."""
    from recipeforge.outputs.checkpoint import checkpoints as checkpoint_dirs, is_complete
    from recipeforge.outputs.manifest import verify
    from recipeforge.outputs.model_files import model_problems

    run_dir = Path(run_dir)
    found = [Subject("final", run_dir / "final", run_dir / EVAL_DIR)]
    if checkpoints:
        for c in checkpoint_dirs(run_dir / "checkpoints"):
            if not (is_complete(c) and _loadable(c)):
                continue
            problems = verify(c) or model_problems(c)
            if problems:
                log(f"warning: skipping {c}: it is damaged ({'; '.join(problems[:3])})")
                continue
            found.append(Subject(c.name, c, run_dir / EVAL_DIR / c.name))
    return found


def _loadable(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file() or (model_dir / "adapter_config.json").is_file()


def evaluate_run(run_dir: Path, tasks: list[str], base_dir: Path, options: EvalOptions,
                 log: Callable[[str], None] = print, *, checkpoints: bool = False, allow_code: bool = False,
                 key: str = "--tasks") -> dict[str, dict[str, dict]]:
    """Evaluate final/ of `run_dir` (and, with `checkpoints`, its kept checkpoints) on `tasks` (names, or
    local files relative to `base_dir`); writes <out dir>/<task>.json for each. Returns the records by
    task, by subject ("final", "checkpoint-N")."""
    require_lm_eval()
    require_final(run_dir)
    if not tasks:
        raise RecipeError("no tasks to evaluate", key="--tasks",
                          hint="pass --tasks NAME_OR_FILE ... or list them in the recipe's eval.tasks")
    done: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="recipeforge-eval-") as include:
        refs = resolve_tasks(tasks, base_dir, Path(include), max_new_tokens=options.max_new_tokens,
                             allow_code=allow_code, key=key)
        manager = _harness_step(lambda: task_manager(refs, Path(include)), refs)
        # Datasets first, models after: a task whose data cannot be loaded is an error in seconds, not
        # after a model has loaded.
        loaded = _harness_step(lambda: load_tasks(refs, manager), refs)
        for i, subject in enumerate(subjects(run_dir, checkpoints=checkpoints, log=log)):
            # The first model is evaluated on the tasks loaded above; each later one on tasks loaded
            # afresh, since lm-eval sets a task's options on the task object as it evaluates it.
            to_run = loaded if i == 0 else [r.harness_name for r in refs]
            done[subject.label] = _evaluate_subject(subject, refs, to_run, manager, options, log)
    return done


def load_tasks(refs: list[TaskRef], manager: TaskManager) -> list[Any]:
    """lm-eval's task (or group) objects for `refs`, their datasets loaded; a name lm-eval expands into
    several tasks (a tag) stays a name. A dataset that cannot be loaded is a `RecipeError` at --tasks."""
    names = [r.harness_name for r in refs]
    with _dataset_errors():
        loaded = manager.load(names)
    return [loaded["tasks"].get(n) or loaded["groups"].get(n) or n for n in names]


def _evaluate_subject(subject: Subject, refs: list[TaskRef], tasks: list[Any], manager: TaskManager,
                      options: EvalOptions, log: Callable[[str], None]) -> dict[str, dict]:
    lm, batch_size = harness_model(subject.model_dir, options)
    log(f"evaluating {subject.model_dir} on {', '.join(r.name for r in refs)} (batch size {batch_size})")
    started = time.monotonic()
    output = _harness_step(lambda: _simple_evaluate(lm, tasks, manager, options), refs)
    seconds = time.monotonic() - started
    records = {}
    for ref in refs:
        records[ref.name] = task_record(ref, output, options, batch_size, seconds)
        write_result(subject.out_dir, ref.name, records[ref.name])
    return records


def _harness_step(step: Callable[[], Any], refs: list[TaskRef]) -> Any:
    """`step()`, with a failure inside a user's own task config (its `!function` module, a template, a
    dataset path it names) as a `RecipeError` naming the task files; lm-eval's failures on its own tasks
    stay internal errors."""
    configs = [r for r in refs if r.source is not None and r.source.suffix != ".jsonl"]
    try:
        return step()
    except (RecipeError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:
        if not configs:
            raise
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise RecipeError(f"lm-eval failed on the task configs {', '.join(str(r.source) for r in configs)}: "
                          f"{type(exc).__name__}: {text}", key="--tasks",
                          hint="the task config, its includes and !function modules run as they are: fix them "
                               "(--debug shows lm-eval's traceback)") from exc


def task_manager(refs: list[TaskRef], include_dir: Path) -> Any:
    """lm-eval's TaskManager over its own tasks and the local ones; an unknown name is a `RecipeError`."""
    from lm_eval.tasks import TaskManager

    paths = [str(include_dir), *sorted({str(r.source.parent) for r in refs if r.source and r.source.suffix != ".jsonl"})]
    # Indexing lm-eval's own thousands of task configs takes seconds: only done when a task names one.
    manager = TaskManager(include_path=paths, include_defaults=any(r.source is None for r in refs))
    known = set(manager.all_tasks)
    for ref in refs:
        if ref.harness_name not in known:
            close = difflib.get_close_matches(ref.harness_name, sorted(known), n=3)
            raise RecipeError(f"unknown lm-eval task {ref.harness_name!r}", key="--tasks",
                              hint=(f"did you mean {', '.join(close)}? " if close else "")
                              + "`lm-eval ls tasks` lists the harness's tasks; a local task is a path to a .jsonl "
                                "or .yaml file")
    return manager


def harness_model(model_dir: Path, options: EvalOptions) -> tuple[Any, int | str]:
    """lm-eval's HF model around a saved model (an adapter on its base, unmerged) and the batch size
    it uses."""
    from lm_eval.models.huggingface import HFLM

    from recipeforge.tools.chat import load_model_dir

    model, tokenizer = load_model_dir(Path(model_dir), device=options.device)
    device = str(model.device)
    batch_size = options.batch_size or ("auto" if device.startswith("cuda") else CPU_BATCH_SIZE)
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device), batch_size


def _simple_evaluate(lm: LM, tasks: list[Any], manager: TaskManager, options: EvalOptions) -> dict[str, Any]:
    import lm_eval

    with _dataset_errors():
        # Fixed seeds (lm-eval's defaults, named here so they cannot drift) and greedy decoding: the same
        # model on the same prompts scores the same, run after run.
        return lm_eval.simple_evaluate(
            model=lm, tasks=tasks, task_manager=manager, limit=options.limit,
            num_fewshot=options.num_fewshot, apply_chat_template=options.apply_chat_template, log_samples=True,
            random_seed=0, numpy_random_seed=1234, torch_random_seed=1234, fewshot_random_seed=1234)


@contextmanager
def _dataset_errors() -> Iterator[None]:
    """A task's dataset that cannot be loaded (lm-eval's tasks download theirs from the Hub when first
    used) as a `RecipeError` at --tasks."""
    from datasets.exceptions import DataFilesNotFoundError, DatasetNotFoundError

    try:
        yield
    except (ConnectionError, DatasetNotFoundError, DataFilesNotFoundError) as exc:
        raise RecipeError(f"a task's dataset could not be loaded: {exc}", key="--tasks",
                          hint="lm-eval's tasks fetch their datasets from the Hugging Face Hub: run where it is "
                               "reachable once (they are cached), or evaluate on a local task file") from None


def task_record(ref: TaskRef, output: dict[str, Any], options: EvalOptions, batch_size: int | str,
                seconds: float) -> dict[str, Any]:
    """What eval/<task>.json holds: scores, the fingerprint of the exact prompts, versions, settings."""
    names = [ref.harness_name, *_subtasks(output.get("group_subtasks", {}), ref.harness_name)]
    samples = [s for name in names for s in output.get("samples", {}).get(name, [])]
    scores, stderr = split_scores(output["results"].get(ref.harness_name, {}))
    return {"task": ref.name, "harness_task": ref.harness_name,
            "source": str(ref.source.resolve()) if ref.source else "lm-eval",
            "scores": scores, "stderr": stderr, "samples": len(samples),
            "n_shot": output.get("n-shot", {}).get(ref.harness_name),
            "task_version": output.get("versions", {}).get(ref.harness_name),
            "prompts_sha256": fingerprint(samples),
            "settings": {"batch_size": batch_size, "limit": options.limit, "num_fewshot": options.num_fewshot,
                         "apply_chat_template": options.apply_chat_template},
            "versions": package_versions(), "seconds": round(seconds, 3),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _subtasks(groups: dict[str, list[str]], name: str) -> list[str]:
    """The tasks below a group task (e.g. mmlu), depth first; none for a plain task."""
    found = []
    for sub in groups.get(name, []):
        found += [sub, *_subtasks(groups, sub)]
    return found


def package_versions() -> dict[str, str | None]:
    """Versions of what produced a score."""
    from recipeforge import __version__

    out: dict[str, str | None] = {"recipeforge": __version__}
    for dist in ("lm_eval", "transformers", "torch", "peft"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out
