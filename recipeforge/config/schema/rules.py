"""Cross-field rules: combinations of individually valid settings that cannot work together.

Each rule takes a built `Recipe` (every section already valid on its own) and yields a
`RuleProblem` naming the key to change and how. `config.validate` runs them after pydantic built the
recipe and reports all violations at once, each at its own key.
"""

from __future__ import annotations

from typing import Iterator

from recipeforge.config.schema.components import COMPONENT_RULES
from recipeforge.config.schema.problems import RuleProblem
from recipeforge.config.schema.recipe import Recipe


def check_rules(recipe: Recipe) -> list[RuleProblem]:
    """Every cross-field problem of `recipe` (empty when consistent)."""
    # Components (formats, kernels, rollout engines, rewards) are checked against their registries,
    # and plugin options against the plugins' own schemas, in `components`.
    out: list[RuleProblem] = []
    for rule in (*CORE_RULES, *COMPONENT_RULES):
        out.extend(rule(recipe))
    return out


def _data(r: Recipe) -> Iterator[RuleProblem]:
    if isinstance(r.data.val_size, float) and r.data.val_size >= 1:
        yield RuleProblem(("data", "val_size"), f"a share must be below 1 (got {r.data.val_size})",
                          "use 0 < x < 1 for a share, or a whole number of rows")
    if r.data.val_size and r.data.eval_datasets:
        yield RuleProblem(("data", "val_size"), "set either val_size or eval_datasets, not both",
                          "drop one of them")


def _adapter(r: Recipe) -> Iterator[RuleProblem]:
    a = r.adapter
    if a.type == "qlora" and r.model.dtype == "fp32":
        yield RuleProblem(("model", "dtype"), "QLoRA computes in bf16 or fp16 on its 4-bit base; fp32 is not supported",
                          "set model.dtype: bf16 (or auto)")
    if a.type == "none" and r.output.merge_adapter:
        yield RuleProblem(("output", "merge_adapter"), "there is no adapter to merge (adapter.type is none)",
                          "set adapter.type: lora, or merge_adapter: false")
    if a.type == "qlora" and r.distributed.backend == "megatron":
        yield RuleProblem(("distributed", "backend"), "QLoRA is not supported on the megatron backend",
                          "use adapter.type: lora, or backend: auto")


def _train(r: Recipe) -> Iterator[RuleProblem]:
    t = r.train
    if t.max_steps is None and t.epochs is None:
        yield RuleProblem(("train", "epochs"), "set train.epochs or train.max_steps", "e.g. train.epochs: 1")
    if isinstance(t.micro_batch_size, int) and t.micro_batch_size > t.global_batch_size:
        yield RuleProblem(("train", "micro_batch_size"),
                          f"micro batch ({t.micro_batch_size}) is larger than the global batch ({t.global_batch_size})",
                          "lower micro_batch_size or raise global_batch_size")
    if t.load_best_model_at_end and not (r.data.val_size or r.data.eval_datasets):
        yield RuleProblem(("train", "load_best_model_at_end"), "choosing the best checkpoint needs evaluation data",
                          "set data.val_size or data.eval_datasets")


def _distributed(r: Recipe) -> Iterator[RuleProblem]:
    d = r.distributed
    if (d.tensor_parallel > 1 or d.pipeline_parallel > 1) and d.backend not in ("auto", "megatron"):
        key = "tensor_parallel" if d.tensor_parallel > 1 else "pipeline_parallel"
        yield RuleProblem(("distributed", key), f"{key} > 1 needs the megatron backend (backend is {d.backend})",
                          "set distributed.backend: megatron (or auto), or set it back to 1")
    if d.zero_stage != "auto" and d.backend not in ("auto", "deepspeed"):
        yield RuleProblem(("distributed", "zero_stage"), f"zero_stage applies to DeepSpeed, not to backend {d.backend}",
                          "set distributed.backend: deepspeed, or remove zero_stage")
    if d.offload not in ("auto", "none") and d.backend in ("single", "ddp", "megatron"):
        yield RuleProblem(("distributed", "offload"), f"backend {d.backend} cannot offload to CPU",
                          "use backend: deepspeed or fsdp (or auto) for offload")
    if d.offload not in ("auto", "none") and d.zero_stage in (0, 1) and d.backend == "deepspeed":
        yield RuleProblem(("distributed", "offload"), f"DeepSpeed offload needs ZeRO stage 2 or 3 (got {d.zero_stage})",
                          "set zero_stage: 2 (optimizer) or 3 (optimizer+params)")
    if d.offload == "optimizer+params" and d.zero_stage == 2:
        yield RuleProblem(("distributed", "offload"), "parameter offload needs ZeRO stage 3",
                          "set zero_stage: 3, or offload: optimizer")


def _stage_specific(r: Recipe) -> Iterator[RuleProblem]:
    if r.stage == "grpo":
        g = r.grpo  # type: ignore[attr-defined]
        if r.train.global_batch_size % g.num_generations:
            yield RuleProblem(("train", "global_batch_size"),
                              f"GRPO needs a global batch divisible by grpo.num_generations "
                              f"({r.train.global_batch_size} % {g.num_generations} != 0)",
                              f"use a multiple of {g.num_generations}, e.g. {g.num_generations * max(1, r.train.global_batch_size // g.num_generations)}")


CORE_RULES = (_data, _adapter, _train, _distributed, _stage_specific)
