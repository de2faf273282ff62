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
happen to be installed where it is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from recipeforge.config.schema.problems import RuleProblem, model_problems
from recipeforge.config.schema.recipe import Recipe
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import rl_section

if TYPE_CHECKING:
    from pydantic import BaseModel

    from recipeforge.registry import Registry


def lookup(registry: "Registry", name: str, path: tuple) -> tuple[Any, RuleProblem | None]:
    """The component `name` (importing its plugin if needed), or the problem at `path` saying why not."""
    try:
        return registry.get(name), None
    except RecipeError as exc:
        p = exc.problems[0]
        return None, RuleProblem(path, p.message, p.hint)


def options_problems(model: object, data: object, path: tuple) -> list[RuleProblem]:
    """`data` checked against a component's options model (no model: anything goes)."""
    if model is None:
        return []
    from pydantic import BaseModel

    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return [RuleProblem(path, f"the plugin declares an options schema that is not a pydantic model "
                                  f"({type(model).__name__})", "report it to the plugin's authors")]

    return model_problems(model, data, path)


def _formats(r: Recipe) -> Iterator[RuleProblem]:
    from recipeforge.components.formats import format_stages, formats

    for section in ("datasets", "eval_datasets"):
        for i, ds in enumerate(getattr(r.data, section)):
            path = ("data", section, i, "format")
            fmt, problem = lookup(formats, ds.format, path)
            if problem is not None:
                yield problem
            elif r.stage not in format_stages(fmt):
                fits = [e.name for e in formats if r.stage in format_stages(e.obj)]
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


def _rollout(r: Recipe) -> Iterator[RuleProblem]:
    rl = rl_section(r)
    if rl is None:
        return
    from recipeforge.components.rollout import rollout_engines

    section, rollout = rl[0], rl[1].rollout
    if rollout_engines.first_party_plugin(rollout.engine) is not None:
        return  # e.g. vllm planned on a machine without recipeforge-vllm; training needs it
    spec, problem = lookup(rollout_engines, rollout.engine, (section, "rollout", "engine"))
    if problem is not None:
        yield problem
        return
    if rollout.mode not in spec.modes:
        yield RuleProblem((section, "rollout", "mode"),
                          f"rollout engine '{spec.name}' has no {rollout.mode} mode (it has {', '.join(spec.modes)})",
                          f"set {section}.rollout.mode: {spec.modes[0]}, or use an engine with a {rollout.mode} mode "
                          f"(e.g. vllm from recipeforge-vllm)")
    yield from options_problems(spec.options, rollout.options, (section, "rollout", "options"))


def _rewards(r: Recipe) -> Iterator[RuleProblem]:
    rl = rl_section(r)
    if rl is None:
        return
    section = rl[0]
    from recipeforge.components.rewards import rewards
    from recipeforge.registry import OPT_IN_HINT, check_code_reference, code_trust_problem, is_code_reference

    for i, spec in enumerate(rl[1].rewards):
        path = (section, "rewards", i, "name")
        if is_code_reference(spec.name):
            bad = check_code_reference(spec.name)
            untrusted = code_trust_problem(f"reward '{spec.name}' is Python code", r.allow_code)
            if bad:
                yield RuleProblem(path, bad, "e.g. my_rewards:format_reward")
            elif untrusted:
                yield RuleProblem(path, untrusted, OPT_IN_HINT)
            continue
        if (spec.args or {}).get("trust_remote_code") is True:
            untrusted = code_trust_problem(f"reward '{spec.name}' sets trust_remote_code: true (the Python code "
                                           f"of its model's repository)", r.allow_code)
            if untrusted:
                yield RuleProblem((section, "rewards", i, "args", "trust_remote_code"), untrusted, OPT_IN_HINT)
        if not rewards.has(spec.name):
            continue  # reported by check_components / when training, with the available rewards
        factory, problem = lookup(rewards, spec.name, path)
        if problem is not None:
            yield problem
            continue
        yield from options_problems(getattr(factory, "args_model", None), spec.args, (section, "rewards", i, "args"))


def _environment(r: Recipe) -> Iterator[RuleProblem]:
    """`grpo.environment`: a registered environment or trusted code; without one, at least one reward."""
    rl = rl_section(r)
    if rl is None:
        return
    section, settings = rl
    env = getattr(settings, "environment", None)
    if env is None:
        if not settings.rewards:
            yield RuleProblem((section, "rewards"), "no reward function: the stage needs at least 1 "
                              "(or a grpo.environment that scores its episodes)",
                              "e.g. rewards: [{name: length, args: {target: 8}}]")
        return
    from recipeforge.components.environments import environments
    from recipeforge.registry import OPT_IN_HINT, check_code_reference, code_trust_problem, is_code_reference

    path = (section, "environment", "name")
    if is_code_reference(env.name):
        bad = check_code_reference(env.name)
        untrusted = code_trust_problem(f"environment '{env.name}' is Python code", r.allow_code)
        if bad or untrusted:
            yield RuleProblem(path, bad or str(untrusted), "e.g. my_envs:Sudoku" if bad else OPT_IN_HINT)
    elif not environments.has(env.name):
        yield _unknown(path, "environment", env.name, environments.names())


def _remote_code(r: Recipe) -> Iterator[RuleProblem]:
    """`model.trust_remote_code: true` runs the Python files of the model's repository: code the
    recipe names, behind the same opt-in as a reward by dotted path."""
    from recipeforge.registry import OPT_IN_HINT, code_trust_problem

    if r.model.trust_remote_code:
        untrusted = code_trust_problem("model.trust_remote_code: true runs the Python code of the model's "
                                       "repository", r.allow_code)
        if untrusted:
            yield RuleProblem(("model", "trust_remote_code"), untrusted, OPT_IN_HINT)


def _unknown(path: tuple, what: str, name: str, known: list[str]) -> RuleProblem:
    from recipeforge.errors import did_you_mean

    close = did_you_mean(name, known)
    return RuleProblem(path, f"unknown {what} '{name}'", f"{close + ' ' if close else ''}available: {', '.join(known)}")


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
                          _unknown(("data", "chat_template"), "chat template", template, known_names()).hint
                          + ", or a path to a .jinja file")
    arch = tiny_arch(r.model.name_or_path)
    if arch is not None and arch not in TINY_CONFIGS:
        yield _unknown(("model", "name_or_path"), "tiny model", r.model.name_or_path,
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
        yield _unknown(("distributed", "preset"), "preset", preset, known)
    elif backend != "auto" and backend not in owners:
        yield RuleProblem(("distributed", "preset"), f"preset '{preset}' belongs to backend {owners[0]}, "
                                                     f"not {backend}",
                          f"use one of {', '.join(known) or 'none'}, or set distributed.backend: {owners[0]}")


COMPONENT_RULES = (_formats, _kernels, _rollout, _rewards, _environment, _remote_code, _names)
