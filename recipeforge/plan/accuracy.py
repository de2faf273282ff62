"""How far a plan's memory estimate can be trusted, and which setting moves it most.

The band comes from the calibration against published, measured peaks (docs/planner.md,
"Calibration"; `bench/plan_calibration.py`): layouts the published runs cover get the spread their
figures were reproduced within (`accuracy_bands`), the others a wider, stated one. The advice re-runs the memory model with one
setting changed, so every "saves X GB" is the model's own difference, not a rule of thumb.
"""

from __future__ import annotations

from dataclasses import replace

from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import Layout, MemoryEstimate, estimate
from recipeforge.plan.workload import Workload

_MIN_SAVING = 0.5 * GIB  # advice below this is noise next to the band


def band_class(w: Workload, layout: Layout) -> str:
    """Which measured spread covers the estimate for `w` on `layout`: ``calibrated`` (one GPU, DDP,
    ZeRO-1/2 without offload), ``sharded`` (FSDP2, ZeRO-3, offload: engine buffers vary with their
    configs) or ``uncalibrated`` (no published figure covers it: Megatron, GRPO generation, MoE,
    vision-language models, a colocated distillation teacher)."""
    colocated_teacher = w.teacher is not None and w.teacher.colocated
    if w.rollout is not None or w.model.is_moe or w.vision is not None or colocated_teacher:
        return "uncalibrated"
    band: str = layout.spec.accuracy_band(w, layout)
    return band


def accuracy_band(w: Workload, layout: Layout) -> float:
    """Relative accuracy expected of the estimate for `w` on `layout` (0.10 = ±10%): the spread
    measured for its class (`accuracy_bands.BANDS`, written by `bench/plan_calibration.py --write-bands`)."""
    from recipeforge.plan.accuracy_bands import BANDS, UNCALIBRATED

    return BANDS.get(band_class(w, layout), UNCALIBRATED)


def sensitivity(w: Workload, layout: Layout, micro: int, ckpt: bool, accumulation: int,
                gpu_memory: float, mem: MemoryEstimate) -> list[str]:
    """The largest components the recipe controls and what changing them saves, largest first."""
    gb = mem.gb()

    def total(w2: Workload = w, micro2: int = micro, ckpt2: bool = ckpt) -> float:
        return estimate(w2, layout, micro2, ckpt2, accumulation=accumulation, gpu_memory=gpu_memory).total

    levers: list[tuple[float, str]] = []
    # Distillation reads the student's full logits (the teacher's top-k against them): no fused loss there.
    if not w.fused_loss and w.teacher is None and gb.get("logits", 0) > 0:
        saved = mem.total - total(replace(w, fused_loss=True))
        levers.append((saved, f"logits {gb['logits']:.1f} GB: fused cross-entropy (kernels: {{liger: "
                              f"{{fused_linear_cross_entropy: true}}}}) saves {saved / GIB:.1f} GB"))
    if not ckpt and gb.get("activations", 0) > 0:
        saved = mem.total - total(ckpt2=True)
        levers.append((saved, f"activations {gb['activations']:.1f} GB: train.gradient_checkpointing: true "
                              f"saves {saved / GIB:.1f} GB"))
    elif micro > 1:
        half = max(1, micro // 2)
        saved = mem.total - total(micro2=half)
        levers.append((saved, f"activations {gb.get('activations', 0):.1f} GB grow with micro batch x "
                              f"sequence length: micro batch {half} saves {saved / GIB:.1f} GB"))
    if gb.get("optimizer_step", 0) > 0 and w.optimizer == "adamw":
        saved = mem.total - total(replace(w, optimizer="adamw_fused"))
        levers.append((saved, f"AdamW's foreach step allocates {gb['optimizer_step']:.1f} GB: train.optimizer: "
                              f"adamw_fused saves {saved / GIB:.1f} GB"))
    if w.full_finetune and gb.get("optimizer", 0) > 0 and w.optimizer in ("adamw", "adamw_fused"):
        saved = mem.total - total(replace(w, optimizer="adamw_8bit"))
        levers.append((saved, f"optimizer states {gb['optimizer']:.1f} GB: train.optimizer: adamw_8bit saves "
                              f"{saved / GIB:.1f} GB"))
    teacher = w.teacher
    if teacher is not None and teacher.colocated and not teacher.load_in_4bit and gb.get("teacher_model", 0) > 0:
        saved = mem.total - total(replace(w, teacher=replace(teacher, load_in_4bit=True)))
        levers.append((saved, f"teacher weights {gb['teacher_model']:.1f} GB on every GPU: distill.teacher."
                              f"load_in_4bit: true saves {saved / GIB:.1f} GB"))
    useful = sorted((lv for lv in levers if lv[0] >= _MIN_SAVING), key=lambda lv: -lv[0])
    if useful:
        return [text for _, text in useful[:2]]
    largest = max(((k, v) for k, v in gb.items() if k != "total"), key=lambda kv: kv[1], default=None)
    return [f"{largest[0].replace('_', ' ')} {largest[1]:.1f} GB is the largest part"] if largest else []


def describe(band: float, levers: list[str]) -> str:
    """One line for the report and plan.json: the band and the levers."""
    head = f"±{band:.0%}"
    return head + ("; " + "; ".join(levers) if levers else "")
