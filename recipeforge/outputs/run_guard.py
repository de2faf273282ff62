"""No lost runs: what `train` may do with a run directory that already holds a run.

The run directory keeps the resolved recipe it was trained with (resolved_recipe.yaml). Before
anything is written, the recipe about to run is compared with it:

- same recipe, run unfinished (checkpoints, no final/): resume, as `output.resume: auto` asks;
- same recipe, run finished (final/ written): refused, a finished run is never trained over;
- changed recipe (hyperparameters, data, ...): refused with the difference; `--force` resumes anyway;
- another recipe (stage, model or adapter differ): refused; only `--overwrite` (start over) helps.

"Same" means equal hashes of the resolved recipes, leaving out the keys that say how to run and log
rather than what to train (`NEUTRAL`). Secrets are compared in their redacted form, so a rotated
token is not a change.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from recipeforge.json_value import JSONValue

import yaml

from recipeforge.errors import RecipeError, format_key

# Keys that change neither the data, the model nor the optimisation: editing them never blocks a resume.
NEUTRAL: tuple[tuple[str, ...], ...] = (
    ("description",),
    ("output", "dir"),
    ("output", "resume"),
    ("output", "save_steps"),
    ("output", "save_total_limit"),
    ("output", "merge_adapter"),
    ("output", "max_shard_size"),   # how final/ is cut into files, not what it holds
    ("output", "push_to_hub"),
    ("logging",),
    ("eval",),                   # benchmarks of the finished model, run after training
    ("train", "divergence"),     # how a diverging run is noticed, not what it trains
    ("data", "num_proc"),
    ("data", "cache_dir"),
    ("lock",),                   # what the recipe was resolved against (checked by `train` on its own)
    # How failed workers are restarted, who starts them and where the nodes meet: a relaunch with more
    # restarts, on another rendezvous host, or through Ray (or no longer), continues the same run.
    ("distributed", "max_restarts"),
    ("distributed", "launcher"),
    ("distributed", "ray_address"),
    ("distributed", "rdzv_backend"),
    ("distributed", "rdzv_endpoint"),
    ("distributed", "rdzv_id"),
)
# Keys whose change makes it another run altogether: its checkpoints cannot be continued.
IDENTITY: tuple[tuple[str, ...], ...] = (("stage",), ("model", "name_or_path"), ("adapter", "type"))
HASH_HEADER = "# recipe-sha256: "
MAX_DIFF_LINES = 20


def comparable(data: dict) -> dict:
    """`data` (a resolved recipe) without the `NEUTRAL` keys, credentials in their redacted form."""
    from recipeforge.config.secrets import redact_literals

    # Redacted on both sides: a run directory written before credentials were redacted compares equal,
    # and a changed password is no change of the recipe (as a rotated ${env:...} token is not).
    out = redact_literals(json.loads(json.dumps(data, default=str)))
    for path in NEUTRAL:
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def recipe_hash(data: dict) -> str:
    """SHA-256 of the comparable part of a resolved recipe (canonical JSON)."""
    text = json.dumps(comparable(data), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def recipe_diff(old: dict, new: dict) -> list[str]:
    """Lines ``key: old -> new`` for every comparable leaf that differs (added/removed keys included)."""
    return [f"{format_key(key)}: {show_value(a)} -> {show_value(b)}"
            for key, a, b in leaf_changes(comparable(old), comparable(new))]


def leaf_changes(old: JSONValue, new: JSONValue) -> list[tuple[tuple, Any, Any]]:
    """``(key path, old, new)`` for every leaf of two nested data trees that differs, in key order;
    a key on one side only has `MISSING` on the other."""
    a, b = _leaves(old), _leaves(new)
    return [(key, a.get(key, _MISSING), b.get(key, _MISSING))
            for key in sorted(set(a) | set(b), key=lambda k: [str(p) for p in k])
            if a.get(key, _MISSING) != b.get(key, _MISSING)]


def check_existing_run(run, new_data: dict, *, force: bool) -> None:
    """Refuse to train into `run` (a `RunDir`) when that would lose or mix up an earlier run.

    `new_data` is the resolved recipe as it will be written to the run directory. `--overwrite` is
    handled by the caller (it wipes the directory before this matters).
    """
    if not run.has_results():
        return
    old = read_resolved(run.resolved_recipe)
    if old is None:
        raise RecipeError(f"run directory {run.root} holds a run without a readable resolved_recipe.yaml",
                          key="output.dir",
                          hint="pass --overwrite to start over, or set output.dir to a new directory")
    if recipe_hash(old) == recipe_hash(new_data):
        if run.final.exists():
            raise RecipeError(f"run directory {run.root} already holds a finished run of this recipe (final/ "
                              "is written)", key="output.dir",
                              hint="pass --overwrite to train it again from scratch, or set output.dir to a new "
                                   "directory (`recipeforge merge` and the files in final/ need no retraining)")
        return
    diff = recipe_diff(old, new_data)
    shown = "\n    ".join(diff[:MAX_DIFF_LINES]) + (f"\n    ... {len(diff) - MAX_DIFF_LINES} more"
                                                     if len(diff) > MAX_DIFF_LINES else "")
    identity = [format_key(p) for p in IDENTITY if _get(old, p) != _get(new_data, p)]
    if identity:
        raise RecipeError(f"run directory {run.root} holds a run of another recipe ({', '.join(identity)} "
                          f"{'differs' if len(identity) == 1 else 'differ'}); its checkpoints cannot be continued:\n    {shown}", key="output.dir",
                          hint="pass --overwrite to delete that run and start over, or set output.dir to a new "
                               "directory")
    if not force:
        state = "finished" if run.final.exists() else "unfinished"
        raise RecipeError(f"run directory {run.root} holds an {state} run of a changed recipe:\n    {shown}",
                          key="output.dir",
                          hint="pass --force to continue that run with the changed recipe, --overwrite to start "
                               "over, or set output.dir to a new directory")


def read_resolved(path: Path) -> dict | None:
    """The resolved recipe a run directory keeps, or None when it is missing or unreadable."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


class _Missing:
    def __repr__(self) -> str:
        return "(unset)"


_MISSING = _Missing()
MISSING = _MISSING  # the side of a `leaf_changes` entry that lacks the key


def _leaves(data: JSONValue, prefix: tuple = ()) -> dict[tuple, Any]:
    if isinstance(data, dict) and data:
        out: dict[tuple, Any] = {}
        for k, v in data.items():
            out.update(_leaves(v, prefix + (k,)))
        return out
    if isinstance(data, list) and data and any(isinstance(v, (dict, list)) for v in data):
        out = {}
        for i, v in enumerate(data):
            out.update(_leaves(v, prefix + (i,)))
        return out
    return {prefix: data}


def show_value(value: object) -> str:
    """A leaf value in one short line (`(unset)` for `MISSING`)."""
    return _show(value)


def _show(value: object) -> str:
    if value is _MISSING:
        return "(unset)"
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def _get(data: dict, path: tuple) -> Any:
    node: Any = data
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node
