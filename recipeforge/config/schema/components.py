"""Rules for the components a recipe names: each must be registered, fit the stage, and its options
must pass the component's own schema.

Registries hold built-ins and list plugin entry points without importing them; a plugin is imported
here only when the recipe names it (to read its stages, modes and options schema). A plugin's options
live under its own key (``kernels.<name>``, ``grpo.rollout.options``, ``grpo.rewards[i].args``)
and are validated against its pydantic model with the same located, hinted problems as the core
schema; the core classes are never changed, so the JSON Schema and docs/recipes.md do not depend on
which plugins are installed.

Unknown reward names are not reported here but by `config.validate.check_components` (and again
when training builds the rewards), so that loading a recipe never depends on which reward plugins
happen to be installed where it is loaded. An RL stage's rollout engine, rewards and environment are
checked in `rl_components`; a component's lookup and options check are `component_lookup`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from recipeforge.config.schema.component_lookup import lookup, options_problems, unknown_name
from recipeforge.config.schema.problems import RuleProblem
from recipeforge.config.schema.recipe import Recipe
from recipeforge.config.schema.rl_components import environment_problems, rewards_problems, rollout_problems

if TYPE_CHECKING:
    from pydantic import BaseModel


def _formats(r: Recipe) -> Iterator[RuleProblem]:
    from recipeforge.components.formats import formats, trains_on

    for section in ("datasets", "eval_datasets"):
        for i, ds in enumerate(getattr(r.data, section)):
            path = ("data", section, i, "format")
            fmt, problem = lookup(formats, ds.format, path)
            if problem is not None:
                yield problem
            elif not trains_on(r.stage, fmt):
                fits = [e.name for e in formats if trains_on(r.stage, e.obj)]
                yield RuleProblem(path, f"stage '{r.stage}' cannot train on format '{ds.format}'",
                                  f"use {' or '.join(fits)} for stage {r.stage}")


def _kernels(r: Recipe) -> Iterator[RuleProblem]:
    from recipeforge.components.kernels import kernels
    from recipeforge.components.models import FLASH_IMPLEMENTATIONS

    for name, options in r.kernels.items():
        path = ("kernels", name)
        if kernels.first_party_plugin(name) is not None:
            continue  # named before its plugin is installed: its options are checked once it is
        spec, problem = lookup(kernels, name, path)
        if problem is not None:
            yield problem
            continue
        problems = options_problems(spec.options, options, path)
        yield from problems
        if not problems:
            yield from _stage_option_problems(spec.options, options, r.stage, path)
        attn = r.model.attn_implementation
        if name == "flash_attn" and attn not in ("auto", *FLASH_IMPLEMENTATIONS):
            yield RuleProblem(("model", "attn_implementation"),
                              f"kernels.flash_attn asks for flash-attention, but attn_implementation is {attn}",
                              "set model.attn_implementation: auto (or flash_attention_2), or drop the kernel")


def _stage_option_problems(model: type[BaseModel] | None, data: object, stage: str, path: tuple) -> Iterator[RuleProblem]:
    """Options the trainer of `stage` refuses: a component's options model may define
    ``stage_problems(stage) -> [(option, message, hint)]`` (e.g. Liger's fused linear cross-entropy,
    which TRL's DPO and GRPO trainers refuse)."""
    if model is None or not callable(getattr(model, "stage_problems", None)):
        return
    options = model.model_validate(data if data is not None else {})
    for option, message, hint in options.stage_problems(stage):
        yield RuleProblem((*path, option), message, hint)


def _remote_code(r: Recipe) -> Iterator[RuleProblem]:
    """`model.trust_remote_code: true` runs the Python files of the model's repository: code the
    recipe names, behind the same opt-in as a reward by dotted path."""
    from recipeforge.registry import OPT_IN_HINT, code_trust_problem

    if r.model.trust_remote_code:
        untrusted = code_trust_problem("model.trust_remote_code: true runs the Python code of the model's "
                                       "repository", r.allow_code)
        if untrusted:
            yield RuleProblem(("model", "trust_remote_code"), untrusted, OPT_IN_HINT)


def _names(r: Recipe) -> Iterator[RuleProblem]:
    """Names the run looks up in tables of its own (not registries): the chat template, the tiny
    architecture of a ``tiny:<arch>`` model, the backend preset."""
    from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
    from recipeforge.components.chat_templates import canonical, is_template_path, known_names
    from recipeforge.registry import registry_for

    template = r.data.chat_template
    # A .jinja path is checked where the recipe's folder is known (when the run loads it).
    if template != "tokenizer" and canonical(template) is None and not is_template_path(template):
        yield RuleProblem(("data", "chat_template"), f"unknown chat template '{template}'",
                          unknown_name(("data", "chat_template"), "chat template", template, known_names()).hint
                          + ", or a path to a .jinja file")
    arch = tiny_arch(r.model.name_or_path)
    if arch is not None and arch not in TINY_CONFIGS:
        yield unknown_name(("model", "name_or_path"), "tiny model", r.model.name_or_path,
                       [f"tiny:{a}" for a in TINY_CONFIGS])
    backend, backends = r.distributed.backend, registry_for("backends")
    if backend != "auto" and not backends.has(backend):
        problem = backends.unknown(backend).problems[0]  # names a first-party plugin to install
        yield RuleProblem(("distributed", "backend"), problem.message, f"{problem.hint}; or auto")
        return
    preset = r.distributed.preset
    if preset:
        yield from _preset(preset, backend)


def _preset(preset: str, backend: str) -> Iterator[RuleProblem]:
    from recipeforge.capabilities import find_preset, preset_names

    found = find_preset(preset)
    owners = [found.backend] if found else []
    known = preset_names(backend)
    if not owners:
        yield unknown_name(("distributed", "preset"), "preset", preset, known)
    elif backend != "auto" and backend not in owners:
        yield RuleProblem(("distributed", "preset"), f"preset '{preset}' belongs to backend {owners[0]}, "
                                                     f"not {backend}",
                          f"use one of {', '.join(known) or 'none'}, or set distributed.backend: {owners[0]}")


COMPONENT_RULES = (_formats, _kernels, rollout_problems, rewards_problems, environment_problems, _remote_code,
                   _names)
