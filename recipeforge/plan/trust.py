"""What a plan records about trust and plugins: whether the recipe may import Python code, and
which plugin components it uses.

`annotate_plan` puts the code-trust decision (the recipe's ``allow_code: true``, or the environment
variable ``RECIPEFORGE_TRUST_CODE=1`` that the CLI's ``--trust-code`` sets) and the plugin components a
recipe names into its plan, so `recipeforge plan` shows them next to the other decisions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from recipeforge.stage_specs import rl_section
from recipeforge.plan.types import Choice, Plan
from recipeforge.registry import BUILTIN, Registry, code_trust, is_code_reference, registry_for

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe


def used_components(recipe: Recipe) -> list[tuple[str, str]]:
    """(group, name) of every registered component `recipe` names."""
    used = [("stages", recipe.stage), ("models", recipe.model.name_or_path)]
    used += [("formats", ds.format) for ds in (*recipe.data.datasets, *recipe.data.eval_datasets)]
    used += [("kernels", name) for name in recipe.kernels]
    rl = rl_section(recipe)
    if rl is not None:
        used.append(("rollout_engines", rl[1].rollout.engine))
        used += [("rewards", r.name) for r in rl[1].rewards if not is_code_reference(r.name)]
    return list(dict.fromkeys(used))


def _registry(kind: str) -> Registry[Any]:
    """The registry of `kind`, its built-ins registered (`registry_for` imports the module that owns it)."""
    return registry_for(kind)


def annotate_plan(plan: Plan, recipe: Recipe, environ: Mapping[str, str] | None = None) -> Plan:
    """`plan` with the code-trust decision and the plugin components `recipe` uses.

    The decision becomes ``plan.reasons["allow_code"]`` (printed with the other decisions), the
    plugin components ``plan.extra.plugins``, and a component whose first-party plugin is not
    installed here a warning. Returns the annotated copy (`Plan` is frozen).
    """
    allowed, reason = code_trust(recipe.allow_code, environ)
    rl = rl_section(recipe)
    code = [r.name for r in (rl[1].rewards if rl is not None else ()) if is_code_reference(r.name)]
    if code:
        reason += f"; imports {', '.join(code)}"
    reasons = {**plan.reasons, "allow_code": Choice(allowed, reason)}
    plugins, warnings = [], list(plan.extra.warnings)
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
    return replace(plan, reasons=reasons, extra=replace(plan.extra, warnings=warnings, plugins=plugins))
