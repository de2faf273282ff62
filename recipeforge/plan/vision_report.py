"""The vision side of a plan for people and for plan.json: the tower and projector, what trains,
what one image becomes, and what it keeps for backward (`PlanExtras.vision`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from recipeforge.plan.hardware import GIB
from recipeforge.plan.models import human_count
from recipeforge.plan.vision_activations import images_per_micro_batch, per_image
from recipeforge.plan.workload import Workload

MIB = 1024 ** 2
SEQUENCE_ASSUMPTION = ("image tokens are part of the text sequence: data.sequence_len bounds text and image "
                       "tokens together, so the language model's activations and logits are sized at it")
CROSS_ATTENTION_ASSUMPTION = ("images reach the language model through cross-attention, one placeholder token each: "
                              "data.sequence_len counts text tokens only")


def vision_summary(w: Workload, micro_batch: int, checkpointing: bool) -> dict[str, Any]:
    """The plan.json fields of the vision side ({} for a text-only model). Byte figures are per image
    at the planned resolution, for the chosen micro batch and checkpointing."""
    v = w.vision
    if v is None:
        return {}
    spec, image = v.spec, v.image
    kept = per_image(w, checkpointing)
    trained_tower = per_image(replace(w, vision=v.with_tower_trained()), checkpointing)
    images = images_per_micro_batch(w, micro_batch)
    return {
        "family": spec.family,
        "tower_params": spec.tower_params,
        "projector_params": spec.projector_params,
        "train_tower": v.train_tower,
        "train_projector": v.train_projector,
        "tower_adapters": bool(v.tower_lora),
        "projector_adapters": bool(v.projector_lora),
        "trainable_params": (v.adapter_params(w.lora_rank, w.lora_dora) if not w.full_finetune
                             else v.full_trainable_params()),
        "max_pixels": image.requested_pixels,
        "image_pixels": image.pixels,
        "patches_per_image": image.patches,
        "llm_tokens_per_image": image.llm_tokens,
        "images_per_sample": v.images_per_sample,
        "image_tokens_per_sample": v.image_tokens_per_sample,
        "images_per_micro_batch": images,
        "activation_bytes_per_image": {"tower": kept.tower, "projector": kept.projector,
                                       "cross_attention": kept.cross_attention, "total": kept.total},
        "activation_bytes_per_image_if_tower_trains": trained_tower.total,
        "activations_gb": round(images * kept.total / GIB, 3),
        "assumption": SEQUENCE_ASSUMPTION if spec.in_sequence else CROSS_ATTENTION_ASSUMPTION,
        "approximate": spec.approximate,
    }


def vision_lines(vision: dict[str, Any], sequence_len: int) -> list[str]:
    """The plan's text lines for `vision_summary` ([] for a text-only model)."""
    if not vision:
        return []

    def trains(flag: bool, adapters: bool) -> str:
        return ("trains, LoRA adapters" if adapters else "trains") if flag else "frozen"

    per = vision["activation_bytes_per_image"]
    images = vision["images_per_sample"]
    tower = trains(vision["train_tower"], vision["tower_adapters"])
    projector = trains(vision["train_projector"], vision["projector_adapters"])
    lines = [f"Vision: {vision['family']} tower {human_count(vision['tower_params'])} params ({tower}), projector "
             f"{human_count(vision['projector_params'])} ({projector}); "
             f"{images} image{'' if images == 1 else 's'} per sample"]
    lines.append(f"  one {vision['image_pixels']}-px image = {vision['patches_per_image']} patches -> "
                 f"{vision['llm_tokens_per_image']} LLM tokens"
                 + (f"; {vision['image_tokens_per_sample']} of the {sequence_len} tokens of a sample are image tokens"
                    if vision["image_tokens_per_sample"] else ""))
    parts = [f"tower {_mib(per['tower'])}" if vision["train_tower"] else "tower 0 (frozen: nothing kept)",
             f"projector {_mib(per['projector'])}"]
    if per["cross_attention"]:
        parts.append(f"cross-attention keys/values {_mib(per['cross_attention'])}")
    line = f"  kept for backward per image: {', '.join(parts)}"
    if not vision["train_tower"]:
        line += f"; training the tower would keep {_mib(vision['activation_bytes_per_image_if_tower_trains'])}"
    lines.append(line)
    lines.append(f"  assumes {vision['assumption']}")
    return lines


def _mib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"
