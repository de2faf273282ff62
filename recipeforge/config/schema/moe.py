"""`moe:` — how a mixture-of-experts model trains: its routers, the load-balancing loss, LoRA on the
experts and the implementation that runs them. Read only for MoE models; a dense model ignores it."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from recipeforge.config.schema.base import Section

# transformers' experts implementations (`transformers.integrations.moe.ExpertsInterface`, plus its
# `eager` Python loop); `auto` is transformers' own default: grouped_mm where the model's experts class
# takes an implementation, else eager.
EXPERTS_IMPLEMENTATIONS = ("auto", "grouped_mm", "batched_mm", "eager")


class MoEConfig(Section):
    """Routers, auxiliary loss and experts of a mixture-of-experts model."""

    train_router: bool = Field(
        False, description="Train the routers (each MoE layer's `gate`). Off by default: a router that moves "
                           "while its experts barely change can collapse onto a few experts. With LoRA the "
                           "routers are trained in full (peft `modules_to_save`, a few thousand weights per layer) "
                           "and saved with the adapter; with a full fine-tune they are trainable weights.")
    aux_loss: bool = Field(
        True, description="Add the model's auxiliary load-balancing loss to the training loss "
                          "(`output_router_logits`); it is logged as `moe/aux_loss` every logging step.")
    aux_loss_coef: Optional[float] = Field(
        None, ge=0, description="Weight of the load-balancing loss (`router_aux_loss_coef`); unset: the model's own "
                                "(0.001 for Qwen3-MoE, 0.02 for Mixtral).")
    lora_experts: Optional[bool] = Field(
        None, description="With LoRA: adapters on the routed experts too, one low-rank pair per expert on the "
                          "fused 3-D expert weights (peft `target_parameters` on `experts.gate_up_proj` and "
                          "`experts.down_proj`), which take no dropout. Unset: on when `adapter.dropout` is 0, "
                          "else LoRA on attention (and any shared-expert linears) only, as the plan says; `true` "
                          "with a dropout is refused.")
    experts_implementation: Literal[EXPERTS_IMPLEMENTATIONS] = Field(
        "auto", description="How a layer's experts run (transformers' `experts_implementation`): `grouped_mm` "
                            "(one grouped GEMM over all experts, torch `grouped_mm`), `batched_mm` (one batched "
                            "matmul over the token-expert pairs, memory-hungry), `eager` (a Python loop over the "
                            "experts hit). `auto`: grouped_mm where the model's experts support it, else eager.")
    log_expert_load: bool = Field(
        True, description="Record each MoE layer's expert load (tokens routed to each expert since the last "
                          "log, on the first process) in metrics.jsonl as `moe/expert_load`, with "
                          "`moe/load_imbalance` (the busiest expert's share over the mean, worst layer) so a "
                          "collapsing router shows.")
