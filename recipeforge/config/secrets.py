"""Secrets in a recipe, redacted wherever the recipe is written or printed.

Two kinds. Values read through ``${env:...}`` from a variable whose name says it holds a secret
(``logging.wandb.api_key: ${env:WANDB_API_KEY}``, a hub token): only the variable's name is kept.
Credentials written into the recipe itself: the userinfo of any URL (``http://user:***@host``) and
the whole value of a key named like a credential (``hf_token``, ``api_key``, ``password``, ...; see
`recipeforge.errors.is_secret_key`). Neither reaches resolved_recipe.yaml, the model card, logs or
plan output; training itself uses the real values.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from recipeforge.credentials import is_secret_key, redact_credentials
from recipeforge.json_value import JSONValue

# Names such as HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_PASSWORD, OPENAI_KEY.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH)|(^|_)KEY$",
                          re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def secret_paths(env_refs: dict[tuple, list[str]]) -> dict[tuple, list[str]]:
    """The key paths whose value was read (wholly or partly) from a secret variable."""
    return {path: [n for n in names if is_secret_name(n)] for path, names in env_refs.items()
            if any(is_secret_name(n) for n in names)}


def redact(data: JSONValue, env_refs: dict[tuple, list[str]]) -> Any:
    """A copy of `data` with every secret-derived value replaced by ``<redacted: ${env:NAME}>``."""
    out = copy.deepcopy(data)
    for path, names in secret_paths(env_refs).items():
        node = out
        try:
            for part in path[:-1]:
                node = node[part]
            if path[-1] in node if isinstance(node, dict) else path[-1] < len(node):
                node[path[-1]] = "<redacted: " + ", ".join(f"${{env:{n}}}" for n in names) + ">"
        except (KeyError, IndexError, TypeError):
            continue
    return out


def secret_values(env_refs: dict[tuple, list[str]], environ) -> list[str]:
    """The secret strings themselves (to scrub from free text such as logs)."""
    return [environ[n] for names in secret_paths(env_refs).values() for n in names if environ.get(n)]


def is_secret_path(loaded, path: tuple) -> bool:
    """Whether the recipe value at `path` came (wholly or partly) from a secret variable."""
    return tuple(path) in secret_paths(getattr(loaded, "env_refs", None) or {})


def public(loaded, path: tuple, value: object, default: object = None) -> Any:
    """`value` (the recipe's value at `path`) for text that lands in files or trackers (run names,
    titles), or `default` when it was read from a secret variable; a credential in it is redacted."""
    if is_secret_path(loaded, path):
        return default
    return redact_credentials(value) if isinstance(value, str) else value


MIN_SCRUB_LENGTH = 6  # shorter values ("1", "true") would blank out ordinary words


def scrub(text: str, environ=None) -> str:
    """`text` with the value of every secret-named environment variable replaced by its name, and
    every credential found by its shape redacted; for messages that may quote a value (an error about
    a key that was set from ``${env:HF_TOKEN}``, a library's exception quoting a tracker URL)."""
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        if len(value) >= MIN_SCRUB_LENGTH and is_secret_name(name) and value in text:
            text = text.replace(value, f"<redacted: ${{env:{name}}}>")
    return redact_credentials(text)


REDACTED = "<redacted>"


def redact_literals(data: JSONValue) -> Any:
    """A copy of `data` with credentials written into it hidden: URL userinfo in every string, and
    the whole value of every key named like a credential (values already redacted stay as they are)."""
    if isinstance(data, dict):
        return {k: REDACTED if _literal_secret(k, v) else redact_literals(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_literals(v) for v in data]
    if isinstance(data, str):
        return redact_credentials(data)
    return data


def _literal_secret(key: str, value: JSONValue) -> bool:
    return is_secret_key(key) and value not in (None, "") and not (isinstance(value, str)
                                                                   and value.startswith("<redacted"))


def has_redactions(loaded) -> bool:
    """Whether writing `loaded` (a `LoadedRecipe`) hides any value: then the written recipe cannot
    stand in for the real one (workers must resolve the recipe themselves)."""
    if secret_paths(getattr(loaded, "env_refs", None) or {}):
        return True
    data = loaded.recipe.model_dump(mode="json")
    return redact_literals(data) != data
