"""Rules for the components an on-policy RL stage (GRPO, RLOO, a plugin's) names: its rollout engine and mode
(and whether it generates ahead, `max_staleness`), its rewards and its tool environment, with the code
opt-in for rewards and environments given as Python code."""

from __future__ import annotations

from typing import Iterator

from recipeforge.config.schema.component_lookup import lookup, options_problems, unknown_name
from recipeforge.config.schema.problems import RuleProblem
from recipeforge.config.schema.recipe import Recipe
from recipeforge.stage_specs import rl_section


def rollout_problems(r: Recipe) -> Iterator[RuleProblem]:
    """The stage's rollout engine: registered, with the mode asked for, its options, and generating ahead
    only where it can."""
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
    found = list(options_problems(spec.options, rollout.options, (section, "rollout", "options")))
    yield from found
    if not found and spec.option_problems is not None and rollout.mode in spec.modes:
        options = spec.options.model_validate(dict(rollout.options or {})) if spec.options else rollout.options
        for option, message, hint in spec.option_problems(rollout, options):
            yield RuleProblem((section, "rollout", "options", option), message, hint)
    staleness = getattr(rl[1], "max_staleness", 0)
    if staleness > 0:
        from recipeforge.components.rollout import asynchronous_problem

        problem = (asynchronous_problem(spec, rollout.mode, section) if rollout.mode in spec.modes else None)
        if problem is not None:
            yield RuleProblem((section, "max_staleness"), *problem)
        elif getattr(rl[1], "environment", None) is not None:
            # TRL runs the tool loop inside the trainer's own generation step, turn by turn.
            yield RuleProblem((section, "max_staleness"), "multi-turn tool episodes are generated on-policy only",
                              f"set {section}.max_staleness: 0, or leave out {section}.environment")


def rewards_problems(r: Recipe) -> Iterator[RuleProblem]:
    """Each reward: trusted when it is Python code, and its arguments checked against its own schema."""
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


def environment_problems(r: Recipe) -> Iterator[RuleProblem]:
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
        yield unknown_name(path, "environment", env.name, environments.names())
