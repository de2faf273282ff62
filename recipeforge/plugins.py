"""What is installed and what is trusted: the `recipeforge plugins` report.

`plugins_report()` loads every plugin entry point of every group (``recipeforge.models``,
``.kernels``, ``.rollout_engines``, ``.rewards``, ``.environments``, ``.formats``, ``.backends``, ``.recipes``,
``.stages``) and
says, per entry, which distribution and version provides it and whether it loaded or why not. A
broken plugin is reported as failed; it never stops the others from loading.

Trust: a recipe may import Python code by dotted path only when the user opts in, by the recipe's
``allow_code: true`` or the environment variable ``RECIPEFORGE_TRUST_CODE=1`` (what the CLI's
``--trust-code`` sets). `annotate_plan` (from `plan.trust`, which the planner calls) puts the decision,
and the plugin components a recipe uses, into its plan.

This module loads every group, backends included, so it sits at the top of the package next to the
CLI; nothing below imports it.
"""

from __future__ import annotations

from typing import Mapping

from recipeforge.config.plugin_recipes import recipes
from recipeforge.plan.trust import annotate_plan, used_components
from recipeforge.registry import FIRST_PARTY, GROUPS, TRUST_ENV, Registry, code_trust, registry_for

__all__ = ["annotate_plan", "plugins_report", "recipes", "render_plugins", "used_components"]

def _registry(kind: str) -> Registry:
    return registry_for(kind)  # the module that owns it is imported, its built-ins registered


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
