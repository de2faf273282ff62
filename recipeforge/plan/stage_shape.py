"""What a stage adds to a training step, for the memory estimate: sequences per sample (chosen and rejected),
the logits' tokens, a reference model, the rollout that generates (GRPO, RLOO, on-policy distillation)
and a distillation teacher."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast

from recipeforge.plan.models import ModelSpec
from recipeforge.plan.teacher import Teacher, build_teacher
from recipeforge.stage_specs import Stage, rl_section, stage_spec

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.stage_recipes import DistillRecipe
    from recipeforge.config.schema.stages import OnPolicyConfig


@dataclass(frozen=True)
class Rollout:
    """GRPO generation: which engine, and how much of the GPU it holds."""

    engine: str                       # "hf" | "vllm" | a plugin's
    colocated: bool                   # shares the training GPUs
    gpu_memory_utilization: float     # vLLM's share of each GPU when colocated
    prompt_len: int
    completion_len: int
    reserves_memory: bool = False     # colocated engine holding gpu_memory_utilization of each GPU (vLLM)
    per_micro_batch: bool = False     # generates one micro batch at a time (distill), not a whole step's (TRL's GRPO)


class StageShape(NamedTuple):
    """What the stage makes of one sample: its sequences, their tokens, a reference model, a rollout."""

    model: ModelSpec
    seq_len: int
    logit_tokens: int
    sequences_per_sample: int
    reference_model: bool
    rollout: Rollout | None
    teacher: Teacher | None = None


def stage_shape(recipe: Recipe, model: ModelSpec, notes: list[str]) -> StageShape:
    """The stage's `StageShape`; appends to `notes` what the estimate assumes for it."""
    adapter = recipe.adapter
    seq = recipe.data.sequence_len
    spec = stage_spec(recipe.stage)
    # chosen + rejected for the pair stages (DPO, ORPO, CPO, reward); KTO puts one completion per row
    # through the policy (its KL completions run without gradients)
    logit_tokens, per_sample, reference, rollout = seq, spec.sequences_per_sample, False, None
    if spec.scores:
        # a one-output score head in place of the LM head: no vocabulary logits
        model = dataclasses.replace(model, num_labels=1)

    # A recipe of a stage is that stage's class (`config.schema.stage_recipes`), which carries its section.
    if spec.reference_model and spec.section is not None:  # DPO, KTO
        named = getattr(recipe, spec.section).reference
        reference = adapter.type == "none" or named != "auto"
        if named != "auto":
            notes.append(f"the {str(spec.name).upper()} reference model is sized like the policy model")
    elif (rl := rl_section(recipe)) is not None:  # GRPO, RLOO: prompts plus sampled completions
        g: OnPolicyConfig = rl[1]
        prompt = g.max_prompt_length or seq
        seq = prompt + g.max_completion_length
        logit_tokens = g.max_completion_length
        reference = g.beta > 0 and adapter.type == "none"
        r = g.rollout
        rollout = Rollout(engine=r.engine, colocated=r.mode == "colocate",
                          gpu_memory_utilization=r.gpu_memory_utilization, prompt_len=prompt,
                          completion_len=g.max_completion_length, reserves_memory=_engine_reserves(r.engine))
    elif recipe.stage == Stage.DISTILL:
        d = cast("DistillRecipe", recipe).distill
        teacher = build_teacher(d, model, notes)
        if d.on_policy > 0:
            # the student samples max_new_tokens after a prompt of up to sequence_len, one micro batch
            # at a time, and those sequences then train: sized at prompt + completion, as GRPO's are
            rollout = Rollout(engine="hf", colocated=True, gpu_memory_utilization=0.0, prompt_len=seq,
                              completion_len=d.max_new_tokens, per_micro_batch=True)
            seq = logit_tokens = seq + d.max_new_tokens
            notes.append(f"on-policy distillation steps are sized at {seq} tokens per sequence (a prompt of up to "
                         f"data.sequence_len plus distill.max_new_tokens {d.max_new_tokens} sampled by the student)")
        return StageShape(model, seq, logit_tokens, per_sample, reference, rollout, teacher)
    return StageShape(model, seq, logit_tokens, per_sample, reference, rollout)


def _engine_reserves(engine: str) -> bool:
    """Whether a colocated rollout engine holds a share of each GPU: as its plugin declares, or, when
    planning on a machine without that plugin, as vLLM (the one engine known to) does."""
    if engine == "hf":
        return False
    from recipeforge.components.rollout import rollout_engines

    if rollout_engines.has(engine):
        try:
            return bool(rollout_engines.get(engine).reserves_gpu_memory)
        except Exception:  # a broken plugin is reported by validation; size it like vLLM meanwhile
            pass
    return engine == "vllm"
