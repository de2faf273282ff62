"""The editor's form view: the fields of a recipe's stage with the values an edit resolves to, and one
dotted key set in the edit's text.

The fields come from the recipe's JSON Schema (form.py); the values are what `recipeforge resolve` writes
(`extends:`, defaults and ${...} applied) or, for an edit that does not validate yet, the merged values
without defaults. Setting a key types the value by its field's schema (never evaluating it) and changes the
text only where it has to (yaml_edit.py). The caller has checked the path and the edit (Editor.guard).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from recipeforge.cli.mcp_server import records
from recipeforge.cli.mcp_server.records import Record, as_data, recipe_namespace
from recipeforge.cli.ui_server.form import field_index, parse_key, stage_form, stages, typed
from recipeforge.cli.ui_server.yaml_edit import set_key
from recipeforge.config.load import load_yaml_text
from recipeforge.errors import RecipeError


def form_of(path: Path, shown: str, text: str) -> Record:
    """The form of an edit of `path` (named `shown` in errors): the fields of its stage, the values it
    resolves to and the dotted keys its own text sets (`set`) or inherits (`inherited`)."""
    own = load_yaml_text(text, shown).data
    ns = recipe_namespace("resolve", shown)
    ns.text = text
    resolved = as_data(records.resolve, ns)
    merged = merged_values(path, text, own)
    values, complete = (merged, False) if "error" in resolved else (resolved["resolved"], True)
    stage = values.get("stage")
    if not isinstance(stage, str) or stage not in stages():
        raise RecipeError(f"the recipe's stage {stage!r} is not one the schema knows", key="stage",
                          hint="set stage: (sft, dpo, ...) in the YAML view")
    own_keys = dotted_keys(own)
    return {"stage": stage, "sections": [f.record() for f in stage_form(stage)], "values": values,
            "set": sorted(own_keys), "inherited": sorted(dotted_keys(merged) - own_keys), "resolved": complete}


def key_set(path: Path, shown: str, text: str, key: object, value: object) -> Record:
    """The edit's text with one dotted `key` set to `value` (typed by the key's schema), changed only
    where it has to be; a key the schema of the recipe's stage does not have, a section or a list is
    refused at the place in the text where it would go."""
    tree = load_yaml_text(text, shown)
    parts = parse_key(key)
    dotted = ".".join(parts)
    stage = merged_values(path, text, tree.data).get("stage")
    if parts == ("stage",):
        stage = value
    fields = field_index(stage) if isinstance(stage, str) and stage in stages() else None
    if fields is None:
        raise RecipeError(f"the recipe's stage {stage!r} is not one the schema knows", key="stage",
                          location=tree.locate(("stage",)), hint="set stage: in the YAML view first")
    field = fields.get(dotted)
    if field is None:
        near = difflib.get_close_matches(dotted, list(fields), n=3)
        raise RecipeError(f"{dotted} is not a key of a {stage} recipe", key=dotted, location=tree.locate(parts),
                          hint=f"did you mean {', '.join(near)}?" if near else
                          "the keys are those `recipeforge schema` lists")
    if field.kind in ("group", "readonly"):
        raise RecipeError(f"{dotted} is {'a section' if field.kind == 'group' else field.note.split(':')[0]}, "
                          "not one value", key=dotted, location=tree.locate(parts), hint="edit it in the YAML view")
    data = typed(field, value)
    return {"text": set_key(text, parts, data, shown), "key": dotted, "value": data}


def merged_values(path: Path, text: str, own: dict[str, object]) -> dict[str, object]:
    """The edit merged with its `extends:` chain (no defaults), or its own values when a parent does not load."""
    from recipeforge.config.compose import compose_file

    try:
        return dict(json.loads(json.dumps(compose_file(path, text).data, default=str)))
    except RecipeError:  # a parent that does not load: the file's own values
        return dict(json.loads(json.dumps(own, default=str)))


def dotted_keys(data: dict[str, object], prefix: str = "") -> set[str]:
    """Every dotted key a mapping sets (sections too); lists are values."""
    out: set[str] = set()
    for name, value in data.items():
        key = f"{prefix}{name}"
        out.add(key)
        if isinstance(value, dict):
            out |= dotted_keys(value, key + ".")
    return out
