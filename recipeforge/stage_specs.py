"""The training stages, named once: one `StageSpec` per stage, in the `stages` registry.

A stage's spec says what the rest of the package needs to know about it: its one-line summary (the
recipe schema and docs/recipes.md show it), its runner (`recipeforge.stages`), the recipe section
only it has, the kinds of dataset format it trains on (`components.formats`), the metrics a finished
run reports for it, and how the model card says the model was trained. The recipe union
(`config.schema.stage_recipes`), the runner table, the format-to-stage table and the run summary are read
from here; a test checks each stage has its recipe class and runner.

A plugin adds a stage by publishing its `StageSpec` in the entry-point group ``recipeforge.stages``:
`stage_spec(name)` finds built-in and plugin stages alike, and the recipe schema makes a plugin
stage's recipe class from its spec (`config.schema.plugin_stages.recipe_class`). `STAGES` and `STAGE_SPECS`
stay the built-in stages (what the docs show).

Fixed sets of names are `Names` enums (torchtitan's StrEnums): members compare, hash and print as
their value, so they stand wherever a plain string is expected. Nothing here imports beyond the
registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.registry import Registry, check_code_reference


class Names(str, Enum):
    """A fixed set of names: members compare, hash and print as their value."""

    def __str__(self) -> str:
        return self.value


class Stage(Names):
    """The training stages."""

    PRETRAIN = "pretrain"
    SFT = "sft"
    DPO = "dpo"
    GRPO = "grpo"
    ORPO = "orpo"
    KTO = "kto"
    CPO = "cpo"
    REWARD = "reward"
    DISTILL = "distill"
    RLOO = "rloo"


STAGES = tuple(s.value for s in Stage)
LOSS = ("loss", "eval_loss")
PREFERENCE = (*LOSS, "rewards/accuracies", "rewards/margins")  # what TRL's preference trainers log


@dataclass(frozen=True)
class StageSpec:
    """What one stage is, for every part of the package that handles stages generically."""

    name: str                           # a `Stage` for the built-in stages
    summary: str                        # one line: the recipe schema's description of the stage
    runner: str                         # "module:Class" of its runner (imported only when a run needs it)
    trained_as: str                     # the model card's "`<base>` ... on <weights>" phrase
    section: str | None = None          # the recipe section only this stage has
    # A plugin stage's section: a pydantic model class (best a `config.schema.base.Section`), the
    # type of the recipe's `section:` key; required when the model has a required field. The built-in
    # stages' sections are fields of their recipe classes (`config.schema.stage_recipes`) instead.
    section_model: Any = None
    format_kinds: tuple[str, ...] = ()  # dataset format kinds it trains on (a format may widen this)
    reports: tuple[str, ...] = LOSS     # metrics a finished run reports (first and last value)
    # Rows one micro batch needs at least, and why: the recipe rules refuse a smaller pinned micro batch
    # and the planner never chooses one, so a run cannot learn of it only once its workers start.
    min_micro_batch: int = 1
    min_micro_batch_why: str = ""
    # An on-policy RL stage: its section (a `config.schema.stages.OnPolicyConfig`) samples
    # `num_generations` completions per prompt through a rollout engine and scores them with reward
    # functions. The planner sizes its rollout, the rules check its batch geometry, the code-trust
    # and service checks read its rewards and rollout.
    rollout: bool = False
    # --- the planner's workload (`plan.stage_shape`) ---
    # Sequences one sample puts through the model per step: 2 for a pair (chosen and rejected), 1 else.
    sequences_per_sample: int = 1
    # The section has a `reference` key ("auto" or a model name): a frozen reference model is loaded
    # (and sized like the policy) for a full fine-tune, or when the key names a model.
    reference_model: bool = False
    # The model is a sequence classifier with one score output, not a generator: the planner sizes a
    # one-output head in place of the LM head, the model card tags it text-classification, and
    # `recipeforge eval` refuses language-model tasks for it.
    scores: bool = False
    # --- language-model data (`components.lm_data`, `stages.streamed_data`) ---
    # Prompt tokens are masked out of the loss (unless `data.train_on_inputs`): the model learns the
    # completions only.
    masks_inputs: bool = False
    # A row longer than `data.sequence_len` becomes several consecutive samples, none cut or dropped
    # (raw documents); otherwise `data.truncation` cuts or drops it.
    splits_long_rows: bool = False
    # `data.packing` is on when the recipe leaves it unset (short documents fill a sequence together).
    packs_by_default: bool = False
    # Its rows can be read as a stream (`data.streaming`): the stage tokenizes them itself, row by row.
    streams: bool = False
    # --- what its trainer's step can do ---
    # `train.activation_offloading` runs for it (its trainer wraps the training step, as TRL's SFT,
    # DPO, KTO and reward trainers and the plain transformers Trainer do).
    activation_offload: bool = False
    # Tensor and context parallel layouts run for it: it trains with the transformers Trainer, whose step
    # does the context-parallel split (`Trainer._prepare_context_parallel_inputs`) and accepts a model
    # sharded at load.
    model_parallel: bool = False

    @property
    def needs_rows(self) -> str:
        """What a micro batch below `min_micro_batch` lacks, for the errors that refuse one."""
        return (f"{str(self.name).upper()} needs micro batches of {self.min_micro_batch} or more rows "
                f"({self.min_micro_batch_why})")


STAGE_SPECS: dict[str, StageSpec] = {s.name: s for s in (
    StageSpec(Stage.PRETRAIN, "Causal-LM pretraining or continued pretraining on raw text.",
              "recipeforge.stages.pretrain:PretrainStage", "pretrained", splits_long_rows=True, packs_by_default=True,
              streams=True, activation_offload=True, model_parallel=True),
    StageSpec(Stage.SFT, "Supervised fine-tuning on instructions, chats or prompt/completion pairs.",
              "recipeforge.stages.sft:SFTStage", "fine-tuned (SFT)", format_kinds=("lm",), masks_inputs=True,
              streams=True, activation_offload=True, model_parallel=True),
    StageSpec(Stage.DPO, "Direct Preference Optimization on chosen/rejected pairs.",
              "recipeforge.stages.dpo:DPOStage", "trained with DPO", section="dpo", format_kinds=("preference",),
              reports=PREFERENCE, sequences_per_sample=2, reference_model=True, activation_offload=True),
    StageSpec(Stage.GRPO, "Group Relative Policy Optimization with reward functions.",
              "recipeforge.stages.grpo:GRPOStage", "trained with GRPO", section="grpo", format_kinds=("prompt",),
              reports=(*LOSS, "reward"), rollout=True),
    StageSpec(Stage.ORPO, "Odds Ratio Preference Optimization on chosen/rejected pairs (no reference model).",
              "recipeforge.stages.orpo:ORPOStage", "trained with ORPO", section="orpo", format_kinds=("preference",),
              reports=PREFERENCE, sequences_per_sample=2),
    StageSpec(Stage.KTO, "Kahneman-Tversky Optimization on completions labelled desirable or undesirable.",
              "recipeforge.stages.kto:KTOStage", "trained with KTO", section="kto",
              format_kinds=("preference", "unpaired"), reports=PREFERENCE, min_micro_batch=2,
              min_micro_batch_why="its KL estimate pairs each prompt with another row's completion",
              reference_model=True, activation_offload=True),
    StageSpec(Stage.CPO, "Contrastive Preference Optimization, or SimPO (`cpo.loss_type: simpo`), on "
                         "chosen/rejected pairs.",
              "recipeforge.stages.cpo:CPOStage", "trained with CPO", section="cpo", format_kinds=("preference",),
              reports=PREFERENCE, sequences_per_sample=2),
    StageSpec(Stage.REWARD, "A Bradley-Terry reward model (sequence classification, one score) trained on "
                            "chosen/rejected pairs.",
              "recipeforge.stages.reward:RewardStage",
              "trained as a Bradley-Terry reward model (a one-output sequence-classification head; a higher score "
              "means a preferred answer)", section="reward", format_kinds=("preference",), reports=PREFERENCE,
              sequences_per_sample=2, scores=True, activation_offload=True),
    StageSpec(Stage.DISTILL, "Knowledge distillation: the model learns a teacher's next-token distributions "
                             "(colocated or served teacher; forward/reverse KL or JSD over its top-k tokens; "
                             "off- or on-policy).",
              "recipeforge.stages.distill:DistillStage", "distilled from a teacher", section="distill",
              format_kinds=("lm",), reports=(*LOSS, "distill/kl"), masks_inputs=True, activation_offload=True),
    StageSpec(Stage.RLOO, "REINFORCE Leave-One-Out with reward functions (each completion's baseline: the mean "
                          "reward of its prompt's other completions).",
              "recipeforge.stages.rloo:RLOOStage", "trained with RLOO", section="rloo", format_kinds=("prompt",),
              reports=(*LOSS, "reward"), rollout=True),
)}


def _as_stage(name: str, obj: object) -> StageSpec:
    """What a plugin's ``recipeforge.stages`` entry point gives, checked: a whole `StageSpec` of that name."""
    if not isinstance(obj, StageSpec):
        raise TypeError(f"a stage must be a recipeforge.stage_specs.StageSpec, got {type(obj).__name__}")
    if obj.name != name:
        raise TypeError(f"the entry point '{name}' publishes the stage '{obj.name}': the two names must match")
    bad = check_code_reference(obj.runner)
    if bad:
        raise TypeError(f"runner: {bad}")
    if (obj.section is None) != (obj.section_model is None) and name not in STAGE_SPECS:
        raise TypeError("a plugin stage with a recipe section gives both `section` and `section_model`")
    if obj.section_model is not None and not (isinstance(obj.section_model, type)
                                              and hasattr(obj.section_model, "model_fields")):
        raise TypeError(f"section_model must be a pydantic model class, got {obj.section_model!r}")
    if obj.min_micro_batch < 1:
        raise TypeError(f"min_micro_batch must be 1 or more, got {obj.min_micro_batch}")
    if obj.sequences_per_sample < 1:
        raise TypeError(f"sequences_per_sample must be 1 or more, got {obj.sequences_per_sample}")
    if obj.reference_model and name not in STAGE_SPECS and "reference" not in getattr(obj.section_model,
                                                                                         "model_fields", {}):
        raise TypeError("reference_model needs a recipe section with a `reference` field (\"auto\" or a model name)")
    return obj


# Built-in and plugin stages; a recipe's `stage:` names one of them.
stage_registry: Registry[StageSpec] = Registry("stages", coerce=_as_stage)
for _spec in STAGE_SPECS.values():
    stage_registry.register(str(_spec.name), _spec)


def stage_spec(name: str) -> StageSpec:
    """The spec of stage `name`, built in or from an installed plugin (loaded on first use); a
    `RecipeError` listing the stages for a name none has."""
    builtin = STAGE_SPECS.get(name)
    return builtin if builtin is not None else stage_registry.get(name, key="stage")


def known_stage_spec(name: object) -> StageSpec | None:
    """The spec of stage `name`, or None when no stage has that name (a recipe not yet validated, a
    run directory of a plugin stage not installed here)."""
    if not isinstance(name, str) or not stage_registry.has(name):
        return None
    try:
        return stage_spec(name)
    except RecipeError:  # a plugin that fails to load: the recipe's `stage:` check reports it
        return None


def stages_with(fact: str) -> tuple[str, ...]:
    """The built-in stages whose spec sets the flag `fact` (e.g. "streams"), for messages that list them."""
    return tuple(str(s.name) for s in STAGE_SPECS.values() if getattr(s, fact))


def stage_names() -> list[str]:
    """Every stage a recipe may name here: the built-in ones, then the plugins' (listed, not imported)."""
    return stage_registry.names()


def rl_section(recipe: Any) -> tuple[str, Any] | None:
    """(name, section) of `recipe`'s on-policy RL section (`grpo:`, `rloo:`; an `OnPolicyConfig`),
    or None for a stage without a rollout (`StageSpec.rollout`)."""
    name = getattr(recipe, "stage", None)
    if not isinstance(name, str) or not stage_registry.has(name):
        return None
    spec = stage_spec(name)
    if not spec.rollout or spec.section is None:
        return None
    return spec.section, getattr(recipe, spec.section)


RL_STAGES = tuple(str(s.name) for s in STAGE_SPECS.values() if s.rollout)


def stages_for_format_kind(kind: str) -> tuple[str, ...]:
    """The built-in stages that train on dataset formats of `kind`."""
    return tuple(str(s.name) for s in STAGE_SPECS.values() if kind in s.format_kinds)


FORMAT_KINDS = tuple(dict.fromkeys(k for s in STAGE_SPECS.values() for k in s.format_kinds))
# Every metric some stage reports, in stage order (what a run summary looks for).
REPORTED_METRICS = tuple(dict.fromkeys(m for s in STAGE_SPECS.values() for m in s.reports))
