"""What is installed and what is trusted: the `recipeforge plugins` report, and the plugin and
code-trust facts a plan carries.

`plugins_report()` loads every plugin entry point of every group (``recipeforge.models``,
``.kernels``, ``.rollout_engines``, ``.rewards``, ``.formats``, ``.backends``, ``.recipes``) and
says, per entry, which distribution and version provides it and whether it loaded or why not. A
broken plugin is reported as failed; it never stops the others from loading.

Trust: a recipe may import Python code by dotted path only when the user opts in, by the recipe's
``allow_code: true`` or the environment variable ``RECIPEFORGE_TRUST_CODE=1`` (what the CLI's
``--trust-code`` sets). `annotate_plan` puts the decision, and the plugin components a recipe uses,
into its plan.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from recipeforge.registry import (BUILTIN, FIRST_PARTY, GROUPS, TRUST_ENV, Registry, code_trust,
                                  is_code_reference, registry_for)

# Where each group's built-ins register (importing the module registers them). Backends register
# in their own package; the report works whether or not it defines a registry.
BUILTIN_MODULES = {
    "models": "recipeforge.plan.catalog",
    "kernels": "recipeforge.components.kernels",
    "rollout_engines": "recipeforge.components.rollout",
    "rewards": "recipeforge.components.rewards",
    "formats": "recipeforge.components.formats",
    "backends": "recipeforge.backends",
}


@dataclass(frozen=True)
class RecipePackage:
    """A plugin's base recipes: ``extends: pkg://<name>/<file>.yaml`` names a file in `directory`."""

    name: str
    directory: Path
    files: tuple[str, ...]


def _as_recipes(name: str, module: Any) -> RecipePackage:
    """A ``recipeforge.recipes`` entry point names a package; its directory holds the YAML files."""
    paths = list(getattr(module, "__path__", None) or [])  # packages (namespace ones too) have a __path__
    if not paths:
        raise TypeError(f"'{getattr(module, '__name__', module)}' is not a package (a directory of YAML files)")
    directory = Path(paths[0])
    files = tuple(sorted(p.name for p in directory.iterdir() if p.suffix in (".yaml", ".yml")))
    if not files:
        raise TypeError(f"package {module.__name__} holds no .yaml recipes")
    return RecipePackage(name, directory, files)


recipes: Registry[RecipePackage] = Registry("recipes", coerce=_as_recipes)


def _registry(kind: str) -> Registry:
    module = BUILTIN_MODULES.get(kind)
    if module:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # a group without built-ins here (e.g. backends registered elsewhere): plugins only
    return registry_for(kind)


def plugins_report(environ: Mapping[str, str] | None = None) -> dict:
    """Every group: its built-in names and each plugin entry (name, distribution, version, status,
    error), plus whether dotted-path code is trusted in this environment. JSON-ready."""
    groups = {}
    for kind, description in GROUPS.items():
        reg = _registry(kind)
        rows = reg.status()
        groups[kind] = {
            "group": reg.group,
            "description": description,
            "builtin": [r["name"] for r in rows if r["status"] == "built-in"],
            "plugins": [r for r in rows if r["status"] != "built-in"],
            "first_party": {n: d for n, d in FIRST_PARTY.get(kind, {}).items() if not reg.has(n)},
        }
    allowed, reason = code_trust(False, environ)
    return {"groups": groups, "trust": {"allowed": allowed, "reason": reason, "environment_variable": TRUST_ENV}}


def render_plugins(environ: Mapping[str, str] | None = None) -> str:
    """`plugins_report` as the text `recipeforge plugins` prints."""
    report = plugins_report(environ)
    lines: list[str] = []
    for kind, g in report["groups"].items():
        lines.append(f"{kind} ({g['group']}): {g['description']}")
        builtin = g["builtin"]
        if builtin:
            shown = ", ".join(builtin) if len(builtin) <= 12 else f"{len(builtin)} (the planner's table of hub ids)"
            lines.append(f"  built in: {shown}")
        for row in g["plugins"]:
            version = row["version"] or "?"
            status = "loaded" if row["status"] == "loaded" else f"FAILED: {row['error']}"
            extra = ""
            if kind == "recipes" and row["status"] == "loaded":
                extra = " (" + ", ".join(f"pkg://{row['name']}/{f}" for f in recipes.get(row["name"]).files) + ")"
            lines.append(f"  {row['name']:<24} {row['distribution']} {version}  {status}{extra}")
        if not g["plugins"]:
            lines.append("  no plugins installed")
        for name, dist in g["first_party"].items():
            lines.append(f"  ({name}: pip install {dist})")
    failed = sum(r["status"] == "failed" for g in report["groups"].values() for r in g["plugins"])
    lines.append("")
    trust = report["trust"]
    lines.append(f"code by dotted path (module:function): {'allowed' if trust['allowed'] else 'not allowed'} "
                 f"here ({trust['reason']}); opt in per recipe with allow_code: true, or per run with "
                 f"--trust-code ({TRUST_ENV}=1)")
    if failed:
        lines.append(f"{failed} plugin entr{'y' if failed == 1 else 'ies'} failed to load (see above); "
                     f"recipes naming them fail, everything else works")
    return "\n".join(lines)


def used_components(recipe) -> list[tuple[str, str]]:
    """(group, name) of every registered component `recipe` names."""
    used = [("models", recipe.model.name_or_path)]
    used += [("formats", ds.format) for ds in (*recipe.data.datasets, *recipe.data.eval_datasets)]
    used += [("kernels", name) for name in recipe.kernels]
    grpo = getattr(recipe, "grpo", None)
    if grpo is not None:
        used.append(("rollout_engines", grpo.rollout.engine))
        used += [("rewards", r.name) for r in grpo.rewards if not is_code_reference(r.name)]
    return list(dict.fromkeys(used))


def annotate_plan(plan, recipe, environ: Mapping[str, str] | None = None):
    """Add the code-trust decision and the plugin components `recipe` uses to `plan` (in place).

    The decision becomes ``plan.reasons["allow_code"]`` (printed with the other decisions), the
    plugin components ``plan.extra["plugins"]``, and a component whose first-party plugin is not
    installed here a warning. Returns `plan`.
    """
    from recipeforge.plan.types import Choice

    allowed, reason = code_trust(recipe.allow_code, environ)
    code = [r.name for r in getattr(getattr(recipe, "grpo", None), "rewards", ()) if is_code_reference(r.name)]
    if code:
        reason += f"; imports {', '.join(code)}"
    plan.reasons["allow_code"] = Choice(allowed, reason)
    plugins, warnings = [], plan.extra.setdefault("warnings", [])
    if recipe.model.trust_remote_code:
        warnings.append("model.trust_remote_code: true runs the Python code of the model's repository")
    for kind, name in used_components(recipe):
        reg = _registry(kind)
        missing = reg.first_party_plugin(name)
        if missing:
            warnings.append(f"{reg.label} '{name}' needs the {missing} plugin, which is not installed here; "
                            f"install it where this recipe trains")
            continue
        if not reg.has(name):
            continue
        entry = reg.entry(name)
        if entry.source != BUILTIN:
            plugins.append({"group": reg.group, "name": name, "distribution": entry.source,
                            "version": entry.version})
    plan.extra["plugins"] = plugins
    return plan
