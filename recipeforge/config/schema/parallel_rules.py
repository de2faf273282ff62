"""What a pinned context-parallel size needs from the recipe alone (sequence length, attention,
packing, model family): read by the recipe rules at validation and by the planner
(`plan.parallel_layouts`), which adds what needs the model and the GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Model types with sliding-window layers: context parallel drops the mask for plain causal attention,
# which Accelerate refuses for them (it would train full attention silently).
SLIDING_WINDOW_MODEL_TYPES = frozenset({"gemma2", "gemma3_text"})
# Unpacked batches are padded to multiples of 8 on GPUs (`components.collate.pad_multiple`); torch's
# load-balanced context parallel needs sequences divisible by 2 x cp, so cp may be at most 4.
MAX_CONTEXT_PARALLEL = 4


@dataclass(frozen=True)
class ParallelRefusal:
    """Why a size cannot be used: the recipe key to change, the message, a hint."""

    key: str
    message: str
    hint: str = ""


def context_parallel_refusal(cp: int, *, seq_len: int, model_type: str, attention: str,
                             packing: bool) -> ParallelRefusal | None:
    """Why a sequence of `seq_len` tokens cannot be split `cp` ways, or None. `attention` is the
    recipe's `model.attn_implementation`."""
    if cp <= 1:
        return None
    key = "distributed.context_parallel"
    if seq_len % (2 * cp):
        return ParallelRefusal("data.sequence_len", f"sequence_len {seq_len} is not divisible by 2 x context_parallel "
                                                    f"({2 * cp}): the load-balanced ring splits each sequence into "
                                                    f"{2 * cp} chunks", f"use a multiple of {2 * cp}")
    if cp > MAX_CONTEXT_PARALLEL:
        return ParallelRefusal(key, f"context_parallel {cp} needs batches padded to multiples of {2 * cp}; unpacked "
                                    "batches are padded to multiples of 8", f"use at most {MAX_CONTEXT_PARALLEL}")
    if attention != "sdpa":
        return ParallelRefusal("model.attn_implementation", f"context parallel runs on sdpa attention only (got "
                                                            f"{attention}): the Trainer refuses other kernels",
                               "set model.attn_implementation: sdpa")
    if packing:
        return ParallelRefusal("data.packing", "context parallel replaces the attention mask with plain causal "
                                               "attention, so packed samples would attend to each other",
                               "set data.packing: false")
    if model_type in SLIDING_WINDOW_MODEL_TYPES:
        return ParallelRefusal(key, f"model type {model_type} has sliding-window layers, which context parallel "
                                    "cannot mask", "set distributed.context_parallel: 1")
    return None


def expert_parallel_refusals(recipe: Any, backend: str, every: Mapping[str, Any]) -> list[ParallelRefusal]:
    """Why a pinned `distributed.expert_parallel` above 1 cannot run, from the recipe alone and the
    backends' capability records (`every`: name -> `BackendCapabilities`; a backend runs it when its
    record lists `expert_parallel`, on the CPU when its CPU sizes do). The planner adds what needs the
    model and the GPUs (`plan.experts`)."""
    d = recipe.distributed
    ep = d.pinned_size("expert_parallel") or 1
    if ep <= 1:
        return []
    key = "distributed.expert_parallel"
    meshes = [name for name, caps in every.items() if "expert_parallel" in caps.parallel_sizes]
    out = []
    if backend != "auto" and backend not in meshes:
        out.append(ParallelRefusal(key, f"expert parallel composes with FSDP2 ({' or '.join(meshes) or 'no backend'}: "
                                        f"transformers' ep_size on the device mesh), not the {backend} backend",
                                   f"set distributed.backend: {meshes[0] if meshes else 'auto'}, or "
                                   "distributed.expert_parallel: 1"))
    elif recipe.hardware is not None and recipe.hardware.gpus_per_node == 0:
        on_cpu = [n for n in meshes if every[n].cpu_parallel_sizes is None
                  or "expert_parallel" in every[n].cpu_parallel_sizes]
        if not on_cpu:
            out.append(ParallelRefusal(key, "expert parallel exchanges tokens by NCCL all-to-all on GPUs; this "
                                            "recipe plans for the CPU (hardware.gpus_per_node: 0)",
                                       "set distributed.expert_parallel: 1"))
    if d.pipeline_parallel > 1:
        out.append(ParallelRefusal(key, "expert parallel does not combine with pipeline parallel (Megatron)",
                                   "set distributed.expert_parallel: 1, or distributed.pipeline_parallel: 1"))
    experts = _known_experts(recipe.model.name_or_path)
    if experts is not None and experts % ep:
        divisors = [n for n in range(2, experts + 1) if experts % n == 0]
        out.append(ParallelRefusal(key, f"{recipe.model.name_or_path} has {experts} experts per MoE layer, which do "
                                        f"not split evenly over {ep} ranks", f"use one of {divisors}, or 1"))
    elif experts is None and _known_dense(recipe.model.name_or_path):
        out.append(ParallelRefusal(key, f"{recipe.model.name_or_path} has no routed experts to split",
                                   "set distributed.expert_parallel: 1 (expert parallel is for mixture-of-experts "
                                   "models)"))
    if recipe.adapter.type != "none":
        why = ("LoRA on the routed experts (peft target_parameters) builds W + B@A from whole expert weights, which "
               "expert parallel splits over ranks" if _experts_adapted(recipe) else
               f"expert parallel trains full fine-tunes ({recipe.adapter.type} on a model sharded at load is not run)")
        out.append(ParallelRefusal(key, why, "set adapter.type: none (a full fine-tune), or "
                                             "distributed.expert_parallel: 1"))
    return out


def _known_experts(name: str) -> int | None:
    """The routed experts per layer of a built-in tiny model (known without reading a config); None
    for a dense tiny model or any other model (the planner checks those)."""
    from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch

    arch = tiny_arch(name)
    value = TINY_CONFIGS.get(arch or "", {}).get("num_experts") if arch else None
    return int(value) if value else None


def _known_dense(name: str) -> bool:
    from recipeforge.components.tiny_spec import tiny_arch

    return tiny_arch(name) is not None


def _experts_adapted(recipe: Any) -> bool:
    """Whether LoRA reaches the experts: `moe.lora_experts`, or when unset, an adapter without dropout
    (`components.moe.experts_adapted`)."""
    flag = recipe.moe.lora_experts
    return bool(flag) if flag is not None else not recipe.adapter.dropout
