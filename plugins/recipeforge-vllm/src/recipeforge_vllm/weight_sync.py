"""Weight sync into vLLM where its kernels repack the weights (vLLM's CPU backend).

TRL pushes the trained weights into a colocated vLLM one tensor at a time through the model's
``load_weights``. That writes into the checkpoint-shaped parameters vLLM keeps on CUDA. vLLM's CPU
backend instead repacks every linear weight for its GEMM kernels after loading and drops the
checkpoint-shaped parameter, so a per-tensor load finds nothing to write into. vLLM's own in-place
reload (``reload_weights``) restores the checkpoint layout, loads every tensor, and repacks again:
on such platforms the trained weights go through it, all at once.

Imports vLLM only when called (the plugin module is loaded while validating recipes).
"""

from __future__ import annotations

from typing import Any


def weights_are_repacked() -> bool:
    """Whether the installed vLLM repacks weights after loading (its CPU platform does)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def install_reload_sync(generation: Any) -> None:
    """Make TRL's colocated `VLLMGeneration` sync weights through vLLM's in-place reload.

    The weights come from TRL's own iterator (``_iter_named_params``), which merges LoRA adapters
    and gathers sharded parameters exactly as TRL's per-tensor sync does; only the way they enter
    vLLM changes.
    """

    def sync_weights() -> None:
        generation.llm.collective_rpc("reload_weights",
                                      kwargs={"weights_iterator": generation._iter_named_params()})
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights
