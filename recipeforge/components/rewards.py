"""GRPO reward functions, from the `rewards` registry (entry-point group ``recipeforge.rewards``).

A registered reward is a *factory*: ``factory(args, ctx) -> reward``, where `args` is the recipe's
``args:`` mapping (validated against ``factory.args_model``, a pydantic model, when the factory has
one; see `reward_args`) and the reward is either a function
``reward(prompts, completions, **columns) -> list[float]`` (TRL's reward-function signature; the
dataset's extra columns arrive as keyword lists) or a `ModelReward` (a sequence-classification
model scoring prompt+completion).

Built-ins: ``exact_match`` (accuracy against a dataset column), ``regex`` (format), ``length``,
``reward_model`` (a reward model directory or hub id).
"""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from recipeforge.errors import Location, RecipeError, did_you_mean
from recipeforge.registry import Registry, code_trust, import_code, is_code_reference


@dataclass(frozen=True)
class RewardContext:
    """What a reward factory may use: the policy tokenizer, the dataset's columns, the device."""

    tokenizer: Any = None
    columns: tuple[str, ...] = ()
    device: str = "cpu"
    allow_code: bool = False


@dataclass
class ModelReward:
    """A reward model (sequence classification, one logit) and its tokenizer."""

    model: Any
    tokenizer: Any


@dataclass
class BuiltRewards:
    """Reward functions in recipe order, with their weights, names and tokenizers (models only)."""

    funcs: list = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    processing_classes: list = field(default_factory=list)


RewardFactory = Callable[[dict, RewardContext], Any]
rewards: Registry[RewardFactory] = Registry("rewards")


def completion_text(completion: object) -> str:
    """The generated text of a completion (plain string, or the last message of a conversation)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def normalize_answer(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation: "The Moo." and "the moo" compare equal."""
    text = " ".join(str(text).lower().split())
    return text.strip(string.punctuation + " ")


def _require(args: dict, name: str, reward: str, kind: type | tuple = object):
    if name not in args:
        raise RecipeError(f"reward '{reward}' needs args.{name}")
    value = args[name]
    if not isinstance(value, kind):
        raise RecipeError(f"reward '{reward}': args.{name} has the wrong type ({type(value).__name__})")
    return value


def _check_args(args: dict, reward: str, allowed: tuple[str, ...]) -> None:
    unknown = [k for k in args if k not in allowed]
    if unknown:
        raise RecipeError(f"reward '{reward}' has no argument '{unknown[0]}'",
                          hint=did_you_mean(unknown[0], allowed) or f"arguments: {', '.join(allowed)}")


def exact_match(args: dict, ctx: RewardContext):
    """1.0 when the completion (or what `extract` captures from it) equals the row's `column`."""
    _check_args(args, "exact_match", ("column", "extract", "normalize", "mode"))
    column = args.get("column", "answer")
    if ctx.columns and column not in ctx.columns:
        raise RecipeError(f"reward 'exact_match' compares against column '{column}', which the data does not "
                          f"have; columns found: {', '.join(ctx.columns)}",
                          hint="set args.column to the column holding the reference answers")
    pattern = _compile(args["extract"], "exact_match") if args.get("extract") else None
    norm = normalize_answer if args.get("normalize", True) else (lambda s: str(s).strip())
    mode = args.get("mode", "exact")
    if mode not in ("exact", "contains"):
        raise RecipeError(f"reward 'exact_match': mode must be exact or contains (got '{mode}')")

    def reward(prompts, completions, **kwargs):
        answers = kwargs[column]
        out = []
        for completion, answer in zip(completions, answers):
            text = completion_text(completion)
            if pattern is not None:
                m = pattern.search(text)
                text = (m.group(1) if m.groups() else m.group(0)) if m else None
            if text is None:
                out.append(0.0)
            elif mode == "contains":
                out.append(1.0 if norm(answer) in norm(text) else 0.0)
            else:
                out.append(1.0 if norm(text) == norm(answer) else 0.0)
        return out

    return reward


def regex(args: dict, ctx: RewardContext):
    """1.0 when the completion matches `pattern` (`mode`: search, match or fullmatch)."""
    _check_args(args, "regex", ("pattern", "mode", "ignore_case"))
    pattern = _compile(_require(args, "pattern", "regex", str), "regex",
                       re.IGNORECASE if args.get("ignore_case") else 0)
    mode = args.get("mode", "search")
    if mode not in ("search", "match", "fullmatch"):
        raise RecipeError(f"reward 'regex': mode must be search, match or fullmatch (got '{mode}')")
    test = getattr(pattern, mode)

    def reward(prompts, completions, **kwargs):
        return [1.0 if test(completion_text(c).strip() if mode == "fullmatch" else completion_text(c)) else 0.0
                for c in completions]

    return reward


def length(args: dict, ctx: RewardContext):
    """1 - |length - target| / target: 1 at the target length, falling linearly either side.

    `unit` is chars (of the completion text) or tokens (generated token ids, EOS excluded).
    """
    _check_args(args, "length", ("target", "unit"))
    target = _require(args, "target", "length", (int, float))
    if target <= 0:
        raise RecipeError(f"reward 'length': args.target must be > 0 (got {target})")
    unit = args.get("unit", "chars")
    if unit not in ("chars", "tokens"):
        raise RecipeError(f"reward 'length': unit must be chars or tokens (got '{unit}')")
    eos = getattr(ctx.tokenizer, "eos_token_id", None)

    def reward(prompts, completions, completion_ids=None, **kwargs):
        if unit == "tokens" and completion_ids is not None:
            sizes = [sum(1 for t in ids if t != eos) for ids in completion_ids]
        else:
            sizes = [len(completion_text(c)) for c in completions]
        return [1.0 - abs(n - target) / target for n in sizes]

    return reward


def reward_model(args: dict, ctx: RewardContext):
    """A sequence-classification reward model (one output logit) from a directory or hub id.

    A recipeforge reward run (`stage: reward`) is accepted as its run directory (merged/ when written,
    else final/), or as its final/ or merged/ directory; a final/ holding a LoRA adapter is merged
    into its base (the run's base_model/ when there is one) once, at load time.
    """
    _check_args(args, "reward_model", ("path", "trust_remote_code"))
    path = _require(args, "path", "reward_model", str)
    from transformers import AutoTokenizer

    trust = bool(args.get("trust_remote_code", False))
    if trust:
        from recipeforge.registry import require_code_trust

        require_code_trust("reward 'reward_model' sets trust_remote_code: true (the Python code of its model's "
                           "repository)", allow_code=ctx.allow_code, key="grpo.rewards.args.trust_remote_code")
    path = _reward_model_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        model = _load_scorer(path, trust)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"reward 'reward_model': cannot load '{path}': {str(exc).splitlines()[0]}",
                          hint="give a directory with a sequence-classification model, or a reachable hub id") \
            from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return ModelReward(model, tokenizer)


def _reward_model_dir(path: str) -> str:
    """`path`, or for a run directory (it has final/ and no model of its own) its merged/ or final/."""
    p = Path(path).expanduser()
    if p.is_dir() and not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        for sub in ("merged", "final"):
            if (p / sub / "config.json").is_file() or (p / sub / "adapter_config.json").is_file():
                return str(p / sub)
    return path


def _load_scorer(path: str, trust: bool):
    """The one-output sequence-classification model at `path` (a LoRA adapter merged into its base).
    A causal LM is refused: loading it as a classifier would score with a random, untrained head."""
    import json

    from transformers import AutoModelForSequenceClassification

    p = Path(path).expanduser()
    adapter = p / "adapter_config.json"
    config = p / "config.json"
    if adapter.is_file():
        cfg = json.loads(adapter.read_text())
        if cfg.get("task_type") not in (None, "SEQ_CLS"):
            raise RecipeError(f"reward 'reward_model': '{path}' holds a {cfg.get('task_type')} adapter, not a "
                              f"reward model", hint="give the final/ directory of a `stage: reward` run")
        local = p.parent / "base_model"  # a random-init base kept next to the adapter (tiny models)
        base = str(local) if (local / "config.json").is_file() else cfg.get("base_model_name_or_path")
        if not base:
            raise RecipeError(f"reward 'reward_model': the adapter in '{path}' does not name its base model")
        from peft import PeftModel

        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, trust_remote_code=trust)
        return PeftModel.from_pretrained(model, str(p)).merge_and_unload()
    if config.is_file():
        architectures = json.loads(config.read_text()).get("architectures") or []
        if architectures and all(a.endswith("ForCausalLM") for a in architectures):
            raise RecipeError(f"reward 'reward_model': '{path}' holds a causal LM ({', '.join(architectures)}), "
                              f"not a reward model; its score head would be random",
                              hint="train one with `stage: reward` and give its final/ (or merged/) directory")
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, trust_remote_code=trust)


def _compile(pattern: str, reward: str, flags: int = 0):
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise RecipeError(f"reward '{reward}': invalid regular expression {pattern!r}: {exc}") from None


# Alphabetical, so the list of available rewards in error hints reads naturally.
for _name, _factory in (("accuracy", exact_match), ("exact_match", exact_match), ("length", length),
                        ("regex", regex), ("reward_model", reward_model)):
    rewards.register(_name, _factory)


def reward_args(factory, args: dict, *, key: str) -> dict:
    """`args` checked against the factory's `args_model` (a pydantic model) when it has one.

    Plugin rewards declare their arguments this way; the recipe's ``args:`` is then validated when the
    recipe loads (located errors), and the factory receives the validated values with defaults.
    """
    model = getattr(factory, "args_model", None)
    if model is None:
        return dict(args)
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(args)).model_dump()
    except ValidationError as exc:  # normally caught when the recipe loads
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecipeError(f"invalid argument{' ' + where if where else 's'}: {first['msg']}", key=key) from None


def get_reward_factory(name: str, *, allow_code: bool, key: str, location: Location | None = None):
    """The factory of `name`: registered (built-in or plugin), or ``module:function`` Python code when
    the user opted in (the recipe's ``allow_code: true``, or ``RECIPEFORGE_TRUST_CODE=1``)."""
    if is_code_reference(name):
        allowed, _ = code_trust(allow_code)
        search_dir = None
        if location is not None and location.file and not location.file.startswith("<"):
            search_dir = str(Path(location.file).resolve().parent)  # a module next to the recipe
        func = import_code(name, allowed=allowed, what="reward", key=key, location=location, search_dir=search_dir)
        if not callable(func):
            raise RecipeError(f"reward '{name}' is not a function", key=key, location=location)
        # Code rewards are plain reward functions; their args become keyword arguments.
        return lambda args, ctx: functools.partial(func, **args) if args else func
    return rewards.get(name, key=key, location=location)


def build_rewards(specs, ctx: RewardContext, *, locate: Callable[[tuple], Location | None] = lambda p: None,
                  section: str = "grpo") -> BuiltRewards:
    """The reward functions of `<section>.rewards` (`grpo`, `rloo`), named after their recipe entries
    (``rewards/<name>/mean`` in the logs; a name used twice gets a numbered suffix)."""
    out = BuiltRewards()
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        key = f"{section}.rewards[{i}]"
        factory = get_reward_factory(spec.name, allow_code=ctx.allow_code, key=f"{key}.name",
                                     location=locate((section, "rewards", i, "name")))
        try:
            built = factory(reward_args(factory, spec.args, key=f"{key}.args"), ctx)
        except RecipeError as exc:
            raise RecipeError([type(p)(p.message, p.location or locate((section, "rewards", i, "args")),
                                       p.key or f"{key}.args", p.hint) for p in exc.problems]) from None
        base = spec.name.split(":")[-1]
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        if isinstance(built, ModelReward):
            # The trainer names a model reward after its config's name; make it the recipe's name.
            built.model.config._name_or_path = name
            out.funcs.append(built.model)
            out.processing_classes.append(built.tokenizer)
        else:
            out.funcs.append(_named(built, name))
            out.processing_classes.append(None)
        out.weights.append(float(spec.weight))
        out.names.append(name)
    return out


def _named(func, name: str):
    """Give a reward function the name the trainer logs it under."""
    @functools.wraps(func)
    def reward(*args, **kwargs):
        return func(*args, **kwargs)

    reward.__name__ = name
    return reward
