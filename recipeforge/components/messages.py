"""Chat datasets laid out their own way (`data.datasets[].messages`): field mappings to OpenAI messages.

A row's message list (column `field`) becomes ``[{role, content[, train]}]``: the role and text
are read from the keys the mapping names, source role names are mapped to user/assistant/system/
tool, a per-row system prompt column or a fixed system prompt is put first, and a per-message
train flag is kept. A row that does not fit is an error naming the row, the message and the key.
"""

from __future__ import annotations

from typing import Any

from recipeforge.errors import RecipeError

STANDARD_ROLES: dict[str, tuple[str, ...]] = {
    "user": ("user", "human"), "assistant": ("assistant", "gpt", "bot", "model"),
    "system": ("system",), "tool": ("tool",),
}


def role_table(roles: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Source role name -> role: the standard names, then the recipe's (which win)."""
    table = {name: role for role, names in STANDARD_ROLES.items() for name in names}
    for role, names in roles.items():
        for name in names:
            table[str(name)] = role
    return table


def _known(roles: dict[str, tuple[str, ...]]) -> str:
    merged: dict[str, list[str]] = {r: list(n) for r, n in STANDARD_ROLES.items()}
    for role, names in roles.items():
        merged[role] = list(dict.fromkeys([*merged[role], *map(str, names)]))
    return "; ".join(f"{r}: {', '.join(n)}" for r, n in merged.items())


def map_row(value: object, system: object, fields, table: dict[str, str], *, row: int, key: str) -> list[dict]:
    """One row's messages as OpenAI messages (see the module docstring); errors name `row` and `key`."""
    def fail(message: str, sub: str, hint: str | None = None) -> RecipeError:
        return RecipeError(f"row {row}: {message}", key=f"{key}.{sub}", hint=hint)

    if not isinstance(value, list) or not value:
        raise fail(f"column '{fields.field}' must be a non-empty list of messages (got {type(value).__name__})",
                   "field")
    out = []
    for n, m in enumerate(value, start=1):
        if not isinstance(m, dict):
            raise fail(f"message {n} is a {type(m).__name__}, not a mapping", "field")
        present = [k for k, v in m.items() if v is not None]
        role_key = fields.role or ("role" if m.get("role") is not None else "from")
        text_key = fields.content or ("content" if m.get("content") is not None else "value")
        if m.get(role_key) is None:
            raise fail(f"message {n} has no '{role_key}' key (keys: {', '.join(present) or 'none'})", "role",
                       hint="set messages.role to the key that holds the role")
        source = str(m[role_key])
        role = table.get(source, table.get(source.lower()))
        if role is None:
            raise fail(f"message {n} has role '{source}', which is not mapped to a role", "roles",
                       hint=f"known roles: {_known(fields.roles)}; add it, e.g. roles: {{user: [{source}]}}")
        content = m.get(text_key)
        if not isinstance(content, str):
            what = "no" if content is None else f"a {type(content).__name__} in its"
            raise fail(f"message {n} has {what} '{text_key}' key, not text (keys: {', '.join(present) or 'none'})",
                       "content", hint="set messages.content to the key that holds the text")
        msg: dict[str, Any] = {"role": role, "content": content}
        if fields.train_field:
            flag = m.get(fields.train_field)
            if flag is not None and not isinstance(flag, bool):
                raise fail(f"message {n} has '{fields.train_field}': {flag!r}; it must be true or false",
                           "train_field")
            if flag is not None:
                msg["train"] = flag
        out.append(msg)
    prompt = system if isinstance(system, str) and system.strip() else fields.system_prompt
    if system is not None and not isinstance(system, str):
        raise fail(f"column '{fields.system_field}' must be text (got {type(system).__name__})", "system_field")
    if prompt and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": prompt})
    return out


def apply_message_fields(ds, fields, *, key: str, where=None):
    """The dataset with its `fields.field` column replaced by a `messages` column of OpenAI messages."""
    import datasets

    found = list(ds.column_names)
    for column, sub in ((fields.field, "field"), (fields.system_field, "system_field")):
        if column is not None and column not in found:
            raise RecipeError(f"column '{column}' not found; columns found: {', '.join(found)}", key=f"{key}.{sub}",
                              location=where)
    table = role_table(fields.roles)
    with_train = bool(fields.train_field)

    def convert(batch, indices):
        systems = batch[fields.system_field] if fields.system_field else [None] * len(indices)
        out = []
        for value, system, i in zip(batch[fields.field], systems, indices):
            msgs = map_row(value, system, fields, table, row=i + 1, key=key)
            out.append([{**m, "train": m.get("train")} if with_train else m for m in msgs])
        return {"messages": out}

    drop = [c for c in (fields.field, fields.system_field) if c and c != "messages"]
    datasets.disable_progress_bars()
    try:
        # A stream (`data.streaming`) converts rows as they are read: it has no cache file to skip.
        cached = {} if isinstance(ds, datasets.IterableDataset) else {"load_from_cache_file": False}
        out = ds.map(convert, batched=True, with_indices=True, **cached,
                     remove_columns=list(dict.fromkeys([*drop, *(["messages"] if "messages" in found else [])])))
    except RecipeError as exc:
        raise RecipeError([type(p)(p.message, p.location or where, p.key, p.hint) for p in exc.problems]) from None
    finally:
        datasets.enable_progress_bars()
    return out
