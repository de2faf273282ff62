"""The files of a saved model (final/, merged/, a checkpoint), read and checked before a library loads them.

`chat`, `serve`, `eval`, `export`, `merge` and `push` read what a run wrote, and a run directory may be
damaged (a copy cut short, a full disk during a save, a file edited by hand) or come from someone else.
transformers, safetensors and peft meet such files with their own exceptions (``SafetensorError``,
``JSONDecodeError``, ``OSError`` naming another file); here each file is checked first, and what still
fails while loading becomes a `RecipeError` naming the folder, so the command exits 2 with one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError

CONFIGS = ("config.json", "adapter_config.json")
JSON_FILES = (*CONFIGS, "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
              "model.safetensors.index.json", "adapter_model.safetensors.index.json", "preprocessor_config.json",
              "processor_config.json", "tokenizer.json")


def read_json_file(path: Path, *, what: str = "file", hint: str | None = None) -> dict[str, Any]:
    """The JSON object in `path`; a `RecipeError` naming the file when it is missing, unreadable, not
    JSON or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RecipeError(f"{path}: missing", hint=hint) from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot be read ({exc.strerror or exc})", hint=hint) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bytes that are not UTF-8, nesting
        raise RecipeError(f"{path}: not a readable JSON {what} ({_first_line(exc)})",
                          hint=hint or "the file is damaged: restore it, or train the run again") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: not a JSON object ({type(data).__name__})",
                          hint=hint or "the file is damaged: restore it, or train the run again")
    return data


def model_problems(model_dir: Path) -> list[str]:
    """What is wrong with the saved model in `model_dir` (empty when nothing is): JSON files that do not
    parse, ``.safetensors`` files shorter or longer than their header says, shards an index names that
    are missing. Reads headers, never tensors."""
    from recipeforge.outputs.manifest import safetensors_length_problem

    model_dir = Path(model_dir)
    problems = []
    for name in JSON_FILES:
        path = model_dir / name
        if path.is_file():
            try:
                read_json_file(path)
            except RecipeError as exc:
                problems.append(f"{name}: " + exc.problems[0].message.removeprefix(f"{path}: "))
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            size = path.stat().st_size
            problem = safetensors_length_problem(path, size)
        except (OSError, KeyError, TypeError, IndexError, AttributeError) as exc:
            problem = f"unreadable safetensors header ({_first_line(exc)})"
        if problem:
            problems.append(f"{path.name}: {problem}")
    for index in ("model.safetensors.index.json", "adapter_model.safetensors.index.json"):
        path = model_dir / index
        if path.is_file() and not any(p.startswith(f"{index}:") for p in problems):
            weight_map = json.loads(path.read_bytes()).get("weight_map")
            shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
            missing = sorted(s for s in shards if not isinstance(s, str) or not (model_dir / s).is_file())
            if missing:
                problems.append(f"{index}: names {len(missing)} missing shard(s), e.g. {missing[0]}")
    return problems


def check_model_dir(model_dir: Path, *, what: str = "model") -> None:
    """A `RecipeError` naming every damaged file of the saved model in `model_dir` (`model_problems`)."""
    problems = model_problems(model_dir)
    if problems:
        raise RecipeError(f"the {what} in {model_dir} is damaged: {'; '.join(problems)}",
                          hint="restore the folder from a copy, or train the run again (a checkpoint that "
                               "verifies can be resumed with output.resume)")


def load_failure(exc: BaseException, model_dir: Path, *, what: str = "model") -> RecipeError:
    """The `RecipeError` for a library's failure to load the model in `model_dir` after the checks of
    `check_model_dir` passed (a config transformers does not know, weights of another shape, a
    tokenizer file of another version...)."""
    return RecipeError(f"cannot load the {what} in {model_dir}: {type(exc).__name__}: {_first_line(exc)}",
                       hint="the folder must hold a model transformers loads (config.json, weights, tokenizer) "
                            "as `recipeforge train` writes it")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
