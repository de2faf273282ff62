"""The plan's reasons for the chosen train step: micro batch and accumulation, checkpointing, ZeRO stage and
offload, QAT, the peak against its limit with the accuracy expected of it, and the models beside the
trained one (a rollout engine, a teacher)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.components.qat import export_format as qat_export_format
from recipeforge.plan.accuracy import accuracy_band, sensitivity
from recipeforge.plan.hardware import GIB
from recipeforge.plan.rollout_split import rollout_reasons
from recipeforge.plan.teacher_memory import teacher_reason
from recipeforge.plan.types import Choice
from recipeforge.stage_specs import rl_section

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.train import TrainConfig
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.workload import Workload


def step_reasons(recipe: Recipe, ev: Evaluation) -> dict[str, Choice]:
    """Batch split, checkpointing, ZeRO stage and offload of the chosen step."""
    layout = ev.layout
    dist, train = recipe.distributed, recipe.train
    reasons: dict[str, Choice] = {}
    reasons["micro_batch_size"] = Choice(ev.micro_batch, _micro_reason(train, ev))
    reasons["gradient_accumulation"] = Choice(
        ev.accumulation, f"global batch {train.global_batch_size} / (micro batch {ev.micro_batch} x "
                         f"{layout.data_parallel} data-parallel rank(s))")
    reasons["gradient_checkpointing"] = Choice(ev.checkpointing, _ckpt_reason(train, ev))
    reasons["zero_stage"] = Choice(layout.zero_stage, "recipe pins it" if dist.zero_stage != "auto" else
                                   ("from the preset" if layout.zero_stage is not None else "not DeepSpeed"))
    reasons["offload"] = Choice(layout.offload, "recipe pins it" if dist.offload != "auto" else
                                ("needed: nothing fits on the GPUs alone" if layout.offload != "none"
                                 else "not needed"))
    if train.qat is not None:
        reasons["qat"] = Choice(train.qat.scheme, f"recipe sets train.qat: torchao fake-quantizes the linear layers "
                                f"(int4 groups of {train.qat.group_size}) while training; final/ holds plain weights "
                                f"for `recipeforge export --format {qat_export_format(train.qat.scheme)}`")
    return reasons


def _micro_reason(train: TrainConfig, ev: Evaluation) -> str:
    if isinstance(train.micro_batch_size, int):
        return "recipe sets it"
    bigger = [t for t in ev.tried if t[0] > ev.micro_batch and t[1] == ev.checkpointing]
    per_rank = train.global_batch_size // ev.layout.data_parallel
    why = f"auto: largest divisor of the per-rank batch {per_rank} (at most 8) that fits"
    if bigger:
        micro, _, need = min(bigger, key=lambda t: t[0])
        why += f"; {micro} would need {need / GIB:.1f} GB"
    return why


def _ckpt_reason(train: TrainConfig, ev: Evaluation) -> str:
    if train.gradient_checkpointing == "selective":
        return "recipe sets it: selective (matmul and attention outputs kept, the rest recomputed)"
    if isinstance(train.gradient_checkpointing, bool):
        return "recipe sets it" + (f": every {train.checkpoint_every}th layer" if train.checkpoint_every > 1 else "")
    if not ev.checkpointing:
        return "auto: off, the step fits without recomputation"
    without = [t for t in ev.tried if not t[1]]
    need = min(t[2] for t in without) if without else 0
    return f"auto: on, without it even micro batch 1 needs {need / GIB:.1f} GB"


def memory_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, limit_gb: float) -> dict[str, Choice]:
    """The peak against its limit and, on GPUs, how accurate that peak is expected to be."""
    layout = ev.layout
    device = hw.device
    reasons: dict[str, Choice] = {}
    capacity = hw.gpu_memory_gb if device == "cuda" else hw.host_ram_gb()[0]
    reasons["memory"] = Choice(round(ev.memory.total / GIB, 2),
                               f"peak per {'GPU' if device == 'cuda' else 'process'}, limit {limit_gb:.1f} GB "
                               f"({recipe.distributed.memory_headroom:.0%} of {capacity:.1f} GB)")
    if device == "cuda":
        band = accuracy_band(w, layout)
        levers = sensitivity(w, layout, ev.micro_batch, ev.checkpointing, ev.accumulation,
                             hw.gpu_memory_gb * GIB, ev.memory)
        reasons["memory_accuracy"] = Choice(
            f"±{band:.0%}", "expected accuracy of the peak (calibrated against published measurements; it "
                            "counts the CUDA context and the allocator's reserve, as nvidia-smi does)"
                            + ("; most sensitive to: " + "; ".join(levers) if levers else ""))
    return reasons


def side_model_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, limit_gb: float) -> dict[str, Choice]:
    """The models beside the trained one: an RL stage's rollout engine and a distillation teacher."""
    reasons: dict[str, Choice] = {}
    rl = rl_section(recipe)
    reasons.update(rollout_reasons(w, hw, ev, limit_gb, group=rl[1].num_generations if rl is not None else 1))
    teacher = teacher_reason(w, ev.memory.gb(), ev.micro_batch)
    if teacher is not None:
        reasons["teacher"] = Choice(*teacher)
    return reasons
