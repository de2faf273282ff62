"""What an evaluation task names: an lm-eval task by name, or a local task file made loadable by lm-eval.

A local JSONL task holds one JSON object a line, all of one kind:

- ``{"prompt": ..., "reference": ...}``: the model's greedy reply to the prompt (stopped at the first
  newline) must equal the reference, leading and trailing whitespace aside (lm-eval ``exact_match``);
- ``{"prompt": ..., "choices": [...], "answer": i}``: the choice with the highest loglikelihood after
  the prompt (and a space) must be ``choices[i]`` (lm-eval ``multiple_choice``, metric ``acc``).

It is turned into an lm-eval task YAML (``dataset_path: json`` on the file, so nothing is downloaded)
that lm-eval's TaskManager loads through ``include_path``: the harness does the prompting and scoring.
A local ``.yaml`` is an lm-eval task config used as it is. Nothing here imports lm-eval or torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipeforge.errors import RecipeError
from recipeforge.json_value import JSONValue

LOCAL_SUFFIXES = (".jsonl", ".yaml", ".yml")
LOCAL_PREFIX = "recipeforge_local_"  # lm-eval name of a local JSONL task: never shadows a harness task
FORMAT_HINT = ('each line of a local task is {"prompt": "...", "reference": "..."} or '
               '{"prompt": "...", "choices": ["...", "..."], "answer": 0}, all lines of one kind')


@dataclass(frozen=True)
class TaskRef:
    """One task to run: its name in results (eval/<name>.json), its lm-eval name, and the local file
    it comes from (None for a harness task)."""

    name: str
    harness_name: str
    source: Path | None = None


def is_local(task: str) -> bool:
    """A path to a task file rather than an lm-eval task name."""
    return task.endswith(LOCAL_SUFFIXES) or "/" in task or "\\" in task


def resolve_tasks(tasks: list[str], base_dir: Path, include_dir: Path, *, max_new_tokens: int,
                  allow_code: bool = False, key: str = "--tasks") -> list[TaskRef]:
    """Each task of `tasks` as lm-eval will load it; local JSONL tasks are checked and written as task
    YAMLs into `include_dir` (local paths are relative to `base_dir`). A malformed file is a `RecipeError`;
    so is an lm-eval task YAML without the code opt-in (`allow_code`: the recipe's, when the tasks come
    from it; `--trust-code` counts either way)."""
    refs = []
    for task in tasks:
        if not is_local(task):
            refs.append(TaskRef(result_name(task), task))
            continue
        path = local_file(task, base_dir, key)
        if path.suffix == ".jsonl":
            refs.append(_jsonl_task(path, include_dir, max_new_tokens))
        else:
            refs.append(_yaml_task(path, key, allow_code=allow_code))
    names = [r.name for r in refs]
    if len(set(names)) != len(names):
        raise RecipeError(f"two tasks have the same name: {', '.join(names)}", key="--tasks",
                          hint="results are written to eval/<name>.json: rename one of the files")
    return refs


def check_recipe_tasks(tasks: list[str], base_dir: Path, *, needs_harness: bool, allow_code: bool = False) -> None:
    """`validate` and `train` before training: every local task of `eval.tasks` exists and is well formed
    (an lm-eval task YAML only with the code opt-in), and lm-eval is installed when `train` is to run
    them; problems point at `eval.tasks`. Light: lm-eval is looked up, not imported."""
    import importlib.util

    for i, task in enumerate(tasks):
        if is_local(task):
            key = f"eval.tasks[{i}]"
            path = local_file(task, base_dir, key)
            if path.suffix == ".jsonl":
                check_jsonl(path, key)
            else:
                _yaml_task(path, key, allow_code=allow_code)
    if tasks and needs_harness and importlib.util.find_spec("lm_eval") is None:
        raise RecipeError("eval.tasks are run after training, but lm-eval is not installed", key="eval.tasks",
                          hint="pip install 'recipeforge[eval]', or set eval.after_training: false")


def local_file(task: str, base_dir: Path, key: str) -> Path:
    """The file a local task names (relative paths against `base_dir`); a `RecipeError` when missing."""
    path = Path(task).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise RecipeError(f"task file not found: {task}", key=key,
                          hint=f"a local task is a .jsonl or lm-eval .yaml file (looked for {path})")
    return path


def task_name(path: Path) -> str:
    """The results name of a local file: its stem, with anything but letters, digits, - and _ as _."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem) or "task"


def _jsonl_task(path: Path, include_dir: Path, max_new_tokens: int) -> TaskRef:
    kind = check_jsonl(path)
    name = task_name(path)
    harness = LOCAL_PREFIX + name.replace("-", "_")
    config = {"task": harness, "dataset_path": "json",
              "dataset_kwargs": {"data_files": {"test": str(path.resolve())}}, "test_split": "test",
              "doc_to_text": "{{prompt}}", **_scoring(kind, max_new_tokens), "metadata": {"version": 1.0}}
    include_dir.mkdir(parents=True, exist_ok=True)
    (include_dir / f"{harness}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return TaskRef(name, harness, path)


def _scoring(kind: str, max_new_tokens: int) -> dict[str, Any]:
    """How lm-eval scores one kind of local row."""
    if kind == "choices":
        return {"output_type": "multiple_choice", "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
                "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    # Whitespace around the reply (a leading space most tokenizers produce) is not a wrong answer.
    return {"output_type": "generate_until", "doc_to_target": "{{reference}}",
            "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": max_new_tokens},
            "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                             "regexes_to_ignore": [r"^\s+", r"\s+$"]}]}


def check_jsonl(path: Path, key: str = "--tasks") -> str:
    """The kind of rows of a local JSONL task ("reference" or "choices"); a `RecipeError` naming the
    first bad line otherwise."""
    kinds = set()
    rows = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _bad_row(path, line_no, f"not JSON ({exc.msg})", key) from None
            kinds.add(_row_kind(row, path, line_no, key))
            if len(kinds) > 1:
                raise _bad_row(path, line_no, "mixes {prompt, reference} and {prompt, choices, answer} rows", key)
            rows += 1
    if not rows:
        raise RecipeError(f"{path}: the task file holds no rows", key=key, hint=FORMAT_HINT)
    return kinds.pop()


def _row_kind(row: JSONValue, path: Path, line_no: int, key: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
        raise _bad_row(path, line_no, "needs a non-empty string \"prompt\"", key)
    if "reference" in row and set(row) <= {"prompt", "reference"}:
        if not isinstance(row["reference"], str):
            raise _bad_row(path, line_no, "\"reference\" must be a string", key)
        return "reference"
    if set(row) == {"prompt", "choices", "answer"}:
        choices, answer = row["choices"], row["answer"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise _bad_row(path, line_no, "\"choices\" must be a list of two or more strings", key)
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise _bad_row(path, line_no, f"\"answer\" must be the index of the right choice (0 to "
                                          f"{len(choices) - 1})", key)
        return "choices"
    raise _bad_row(path, line_no, f"unexpected keys {sorted(row)}", key)


def _bad_row(path: Path, line_no: int, what: str, key: str) -> RecipeError:
    return RecipeError(f"{path}:{line_no}: malformed task row: {what}", key=key, hint=FORMAT_HINT)


class _AnyTagLoader(yaml.SafeLoader):
    """Reads lm-eval task YAMLs, whose ``!function module.f`` tags name code: kept as plain text here."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)
MAX_INCLUDES = 32  # files in one task's `include:` chain: a deeper chain is a loop or a mistake


def _read_task_yaml(path: Path, key: str) -> dict[str, Any]:
    try:
        config = yaml.load(path.read_text(encoding="utf-8", errors="replace"), Loader=_AnyTagLoader)
    except (yaml.YAMLError, RecursionError, OSError) as exc:
        raise RecipeError(f"{path}: not a readable YAML file ({str(exc).splitlines()[0]})", key=key,
                          hint="a local .yaml task is an lm-eval task config with a `task:` name") from None
    if not isinstance(config, dict):
        raise RecipeError(f"{path}: an lm-eval task config is a mapping, this file holds a {type(config).__name__}",
                          key=key, hint="an lm-eval task YAML names its task, e.g. task: my_task")
    return config


def include_chain(path: Path, key: str) -> list[Path]:
    """`path` and every file its `include:` entries reach (relative to the including file, as lm-eval
    reads them), each checked to exist and parse; a loop or a missing file is a `RecipeError`."""
    chain, todo = [], [(path.resolve(), None)]
    while todo:
        file, parent = todo.pop(0)
        if file in chain:
            raise RecipeError(f"{parent}: `include: {file.name}` includes a file already in its chain (a loop)",
                              key=key, hint="remove the include that leads back")
        if not file.is_file():
            raise RecipeError(f"{parent}: `include:` names {file}, which does not exist", key=key,
                              hint="include paths are relative to the file that includes them")
        chain.append(file)
        if len(chain) > MAX_INCLUDES:
            raise RecipeError(f"{path}: its `include:` chain passes {MAX_INCLUDES} files", key=key)
        includes = _read_task_yaml(file, key).get("include") or []
        for inc in includes if isinstance(includes, list) else [includes]:
            if not isinstance(inc, str) or not inc:
                raise RecipeError(f"{file}: `include:` entries are file names (got {inc!r})", key=key)
            todo.append(((file.parent / Path(inc).expanduser()).resolve(), file))
    return chain


def _yaml_task(path: Path, key: str, *, allow_code: bool = False) -> TaskRef:
    """A local lm-eval task config: code to lm-eval (its templates are rendered by unsandboxed Jinja, its
    `!function` tags import the modules next to it, its `include:` chain pulls in more of both), so it
    runs only with the opt-in. Its `include:` chain is checked here; its results go to
    eval/<task name>.json, the name reduced to file-name characters."""
    from recipeforge.registry import require_code_trust

    config = _read_task_yaml(path, key)
    require_code_trust(f"task file {path} is an lm-eval task config, which runs code (Jinja templates, "
                       "!function, include:)", allow_code=allow_code, key=key)
    include_chain(path, key)
    name = config.get("task")
    if not isinstance(name, str) or not name:
        raise RecipeError(f"{path}: no `task:` name in this lm-eval task config", key=key,
                          hint="an lm-eval task YAML names its task, e.g. task: my_task")
    return TaskRef(result_name(name), name, path)


def result_name(name: str) -> str:
    """A task's name as the file name of its results (eval/<name>.json): letters, digits, '.', '-' and
    '_' kept, anything else (a '/', a '..') as '_'; never hidden or empty."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".") or "task"
