"""DeepSpeed ZeRO-0/1/2/3 (with CPU optimizer / parameter offload) under the transformers/TRL trainers.

The DeepSpeed config comes from the plan (`backends.artifacts.deepspeed_config`): explicit batch sizes
(micro x accumulation x world), the ZeRO stage, offload, precision. It is written to the run directory
as deepspeed.json for the launcher and humans; each worker builds the same dict from the same plan.

On the CPU (gloo) DeepSpeed only sees the right world when Accelerate's state is created for DeepSpeed
*before* the trainer arguments exist (ACCELERATE_USE_DEEPSPEED, then the trainer told to use that
configured state); otherwise Accelerate counts one process while DeepSpeed counts all of them. The
same order works on GPUs, so it is the one path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, common_report, full_state_dict_save, streamed_final_save
from recipeforge.capabilities import OFFLOAD_MODES, BackendCapabilities, Preset
from recipeforge.plan.backend_spec import Candidate, CpuSpread
from recipeforge.plan.estimators import deepspeed_zero3_mem_needs, zero_model_states
from recipeforge.plan.memory import BUFFER_FACTOR, Layout, assign_trainable, optimizer_state_bytes
from recipeforge.plan.types import BackendPart, Plan

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer

    from recipeforge.config.schema import DistributedConfig, Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.workload import Workload
    from recipeforge.stages.context import StageContext, WorkerHooks


def preset_name(zero_stage: int, offload: str) -> str:
    """The preset name of a ZeRO stage and offload (``zero3_offload``, ...)."""
    suffix = {"none": "", "optimizer": "_offload", "optimizer+params": "_offload_params"}[offload]
    return f"zero{zero_stage}{suffix}"


NAME = "deepspeed"


@dataclass(frozen=True)
class ZeroPart(BackendPart):
    """DeepSpeed's part of a plan: the ZeRO stage it runs."""

    zero_stage: int = 0

    def rows(self) -> list[tuple[str, str]]:
        return [("zero stage", str(self.zero_stage))]


def zero_part(plan: Plan) -> ZeroPart:
    """DeepSpeed's part of `plan` (the part a DeepSpeed plan carries: `plan_part_type`)."""
    part = plan.backend_part
    assert isinstance(part, ZeroPart), f"a {plan.backend} plan has no ZeRO stage"
    return part


PRESETS = tuple(Preset(preset_name(z, o), NAME, zero_stage=z, offload=o) for z, o in (
    (0, "none"), (1, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params")))

# (tier, within, ZeRO stage, offload, offered unpinned, why): the layouts DeepSpeed offers on GPUs
LAYOUTS = (
    (2, 1, 2, "none", True, "optimizer states sharded (ZeRO-2 also shards gradients); same traffic as DDP"),
    (2, 2, 1, "none", False, "optimizer states sharded; same traffic as DDP"),
    (2, 3, 0, "none", False, "DeepSpeed without partitioning"),
    (3, 1, 3, "none", True, "ZeRO-3: weights, gradients and optimizer states sharded; 1.5x DDP traffic"),
    (6, 0, 2, "optimizer", True, "ZeRO-Offload: optimizer states and step on the CPU, 16-bit weights on each GPU"),
    (6, 1, 3, "optimizer", True, "ZeRO-3 with the optimizer states and step on the CPU"),
    (7, 1, 3, "optimizer+params", True,
     "ZeRO-3 with optimizer states and parameters in CPU memory (ZeRO-Infinity style)"),
)


def cpu_settings(dist: DistributedConfig) -> tuple[int, str, str]:
    """(ZeRO stage, offload, preset) of DeepSpeed on the CPU: the recipe's preset or pins, else ZeRO-2
    (ZeRO-3 for a pinned parameter offload) without offload (memory is not what a CPU run is short of)."""
    if dist.preset:
        from recipeforge.plan.presets import get_preset

        p = get_preset(dist.preset, backend=NAME)
        assert p.zero_stage is not None  # every DeepSpeed preset names its stage (`PRESETS`)
        return p.zero_stage, p.offload, p.name
    offload = dist.offload if dist.offload != "auto" else "none"
    zero = dist.zero_stage if dist.zero_stage != "auto" else (3 if offload == "optimizer+params" else 2)
    return zero, offload, preset_name(zero, offload)


class DeepSpeedBackend(BackendSpec):
    """ZeRO data parallelism through DeepSpeed's engine."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "ZeRO data parallelism; gloo on the CPU",
        offload=OFFLOAD_MODES, zero_stages=(0, 1, 2, 3),
        offload_zero_stages={"optimizer": (2, 3), "optimizer+params": (3,)},
        qlora_zero_stages=(0, 1, 2), offload_optimizers=("adamw", "adamw_fused"),
        presets=tuple(p.name for p in PRESETS), package="deepspeed", extra="deepspeed",
        why={"qlora_zero": "ZeRO-3 partitions 4-bit QLoRA weights (stored as bf16/fp16 words, "
                           "bnb_4bit_quant_storage) but not 8-bit ones, which are int8 with per-row scales",
             "offload_zero": "ZeRO offloads optimizer states from stage 2 and parameters from stage 3",
             "offload_optimizer": "DeepSpeed steps offloaded optimizer states with its own CPU Adam"})
    presets = PRESETS
    plan_part_type = ZeroPart
    cpu_preference = 2  # on the CPU only for what DDP cannot do (a pinned offload)
    trainer_holds_weights = False
    torch_allocates_gradients = False
    checkpoints_master_weights = True  # fp32 master weights travel with DeepSpeed's optimizer state

    # -- planning ---------------------------------------------------------------------------------
    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        out = []
        for tier, within, zero, offload, unpinned, why in LAYOUTS:
            if offload == "none" and g <= 1 and not pinned:
                continue  # one GPU: nothing to shard over until memory runs out
            if not (unpinned or pinned):
                continue
            out.append(Candidate(Layout(NAME, preset_name(zero, offload), data_parallel=g, zero_stage=zero,
                                        offload=offload, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node),
                                 tier, why, within))
        return out

    def cpu_candidate(self, dist: DistributedConfig) -> Candidate:
        zero, offload, preset = cpu_settings(dist)
        return Candidate(Layout(NAME, preset, zero_stage=zero, offload=offload, nodes=1, gpus_per_node=0),
                         1, f"DeepSpeed ZeRO-{zero} on the CPU (gloo), one process planned")

    def cpu_spread(self, dist: DistributedConfig) -> CpuSpread:
        zero, offload, preset = cpu_settings(dist)
        return CpuSpread(preset=preset, zero_stage=zero, offload=offload, part=ZeroPart(zero))

    def shards_weights(self, layout: Layout) -> bool:
        return layout.zero_stage == 3

    def plan_shards_weights(self, plan: Plan) -> bool:
        return zero_part(plan).zero_stage == 3

    def streams_final_save(self, w: Workload, layout: Layout) -> bool:
        # `outputs.streamed_save`: each partitioned parameter gathered alone; a checkpoint layout that
        # combines tensors (fused MoE experts written back one per expert) takes the gathered state dict
        return layout.zero_stage == 3 and not w.model.is_moe

    def recipe_refusals(self, recipe: Recipe) -> list[tuple[str, str]]:
        # torchao's float8 linear layers compose with FSDP2 and DDP; ZeRO partitions and casts the
        # weights itself, so `auto` never plans fp8 training on DeepSpeed.
        if recipe.train.precision == "fp8":
            return [("train.precision", "train.precision: fp8 training uses torchao's float8 linear layers, which "
                                        "compose with FSDP2 and DDP, not with DeepSpeed ZeRO (its engine "
                                        "partitions and casts the weights itself)")]
        return []

    def plan_part(self, layout: Layout) -> ZeroPart:
        assert layout.zero_stage is not None  # every DeepSpeed layout names its stage (`candidates`)
        return ZeroPart(layout.zero_stage)

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        return zero_states(w, layout, part, trainable, frozen_bytes)

    def accuracy_band(self, w: Workload, layout: Layout) -> str:
        return "sharded" if layout.offload != "none" or layout.zero_stage == 3 else "calibrated"

    def precision(self, w: Workload) -> str:
        return f"{w.dtype} weights and gradients; fp32 master weights, gradients and optimizer states"

    # -- running ----------------------------------------------------------------------------------

    def launcher(self, plan: Plan) -> str:
        return "accelerate"  # even one process: the DeepSpeed engine needs a launched worker

    def config(self, plan: Plan, recipe: Recipe) -> dict[str, Any]:
        """The DeepSpeed config dict of this plan."""
        from recipeforge.backends.artifacts import deepspeed_config

        return deepspeed_config(plan, recipe)

    def accelerate_config(self, plan: Plan, recipe: Recipe, run_dir: Path) -> dict[str, Any]:
        return {"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"deepspeed_config_file": str(run_dir / "deepspeed.json"),
                                     # as in `setup_worker`: checkpoints load partitioned
                                     "zero3_init_flag": zero_part(plan).zero_stage == 3 and not _random_init(recipe),
                                     # one launcher per node (torch's elastic agent), like DDP; no ssh/pdsh
                                     "deepspeed_multinode_launcher": "standard"}}

    def launch_files(self, plan: Plan, recipe: Recipe) -> dict[str, str]:
        import json

        return {"deepspeed.json": json.dumps(self.config(plan, recipe), indent=2) + "\n"}

    def launch_env(self, plan: Plan) -> dict[str, str]:
        from recipeforge.backends.deepspeed_ops import extensions_dir

        return {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or extensions_dir()}

    def setup_worker(self, ctx: StageContext) -> WorkerHooks:
        """Accelerate's state for DeepSpeed (see the module); under ZeRO-3 the base goes straight into
        partitions: a checkpoint through zero.Init, or, for a 4-bit QLoRA base and for any random-init
        model, tensor by tensor (`sharded_loading`)."""
        from accelerate import PartialState

        from recipeforge.backends import deepspeed_ops
        from recipeforge.log import log
        from recipeforge.stages.context import WorkerHooks

        os.environ.setdefault("TORCH_EXTENSIONS_DIR", deepspeed_ops.extensions_dir())
        # Built here, one rank at a time, before DeepSpeed asks for them (and would wait for ever on a lock
        # a stopped build left): the shared-memory all-reduce at its start, CPU Adam at the optimizer.
        deepspeed_ops.ensure_built(deepspeed_ops.needed(on_cpu=ctx.plan.device != "cuda",
                                                        offload_optimizer=ctx.plan.offload != "none"),
                                   log=log)
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="nccl" if ctx.plan.device == "cuda" else "gloo")
        self._hf_config = None
        zero3 = zero_part(ctx.plan).zero_stage == 3
        quantized = ctx.recipe.adapter.type == "qlora" and ctx.recipe.adapter.quant.bits == 4
        if zero3 and (quantized or _random_init(ctx.recipe)):
            # No process holds the whole base: placeholders now, the base read or made into ZeRO-3
            # partitions once the trainer (and its DeepSpeed config) exists, before the engine starts.
            from recipeforge.backends import sharded_hooks

            record: dict[str, int] = {}
            return WorkerHooks(load_sharded=sharded_hooks.loader(ctx, record),
                               prepare_trainer=sharded_hooks.partition_and_fill(ctx, record), makes_random=True)
        if zero3:
            # Checkpoints load straight into ZeRO-3 partitions (zero.Init) instead of whole on every
            # process.
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_config = HfDeepSpeedConfig(self.config(ctx.plan, ctx.recipe))  # kept alive: a weakref
        return WorkerHooks()

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        return {"deepspeed": self.config(ctx.plan, ctx.recipe), "use_cpu": False,
                "accelerator_config": {"use_configured_state": True}}

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        if zero_part(ctx.plan).zero_stage != 3:
            return super().save_final(ctx, trainer, model, tokenizer)
        # Full weights: each partitioned parameter gathered alone (collective) and written by rank 0.
        streamed = streamed_final_save(ctx, model, tokenizer, "zero3", model)
        if streamed is not None:
            return streamed
        # Collective: every rank hands its partition; the main process gets the whole state dict.
        state_dict = trainer.accelerator.get_state_dict(trainer.model_wrapped)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        report = common_report(trainer)
        engine = trainer.model_wrapped
        report["engine"] = type(engine).__name__
        stage = getattr(engine, "zero_optimization_stage", None)
        report["zero_stage"] = stage() if callable(stage) else None
        params = list(engine.module.parameters()) if hasattr(engine, "module") else []
        # ZeRO-3 keeps a 1/world slice of every parameter (`ds_tensor`) and an empty placeholder.
        report["partitioned_params"] = sum(1 for p in params if hasattr(p, "ds_tensor"))
        report["local_param_elements"] = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                                             for p in params)
        report["full_param_elements"] = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        # QLoRA's 4-bit base weights (bitsandbytes Params4bit, packed into 16-bit words): partitioned too?
        quantized = [p for p in params if type(p).__name__ == "Params4bit"]
        if quantized:
            report["quantized_params"] = len(quantized)
            report["partitioned_quantized_params"] = sum(1 for p in quantized if hasattr(p, "ds_tensor"))
            report["quantized_local_elements"] = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                                                     for p in quantized)
            report["quantized_full_elements"] = sum(getattr(p, "ds_numel", p.numel()) for p in quantized)
        offload = getattr(engine, "zero_offload_optimizer", None)
        report["offload_optimizer"] = bool(offload()) if callable(offload) else False
        return report


def zero_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float) -> float:
    """DeepSpeed mixed precision as its estimators count it: 16-bit weights and gradients, and
    K = 16 bytes of fp32 state per parameter (master weights, gradients, momentum, variance).
    Stage 1 partitions K, stage 2 also the 16-bit gradients, stage 3 also the weights (its 16-bit
    gradients are reduced straight into the fp32 partition). Returns host bytes per node."""
    m, c, n = w.model, w.compute_bytes, layout.data_parallel
    stage = layout.zero_stage or 0
    fp32_extra = 8 if w.dtype != "fp32" else 0  # fp32 master weights + fp32 gradient partition
    k = fp32_extra + optimizer_state_bytes(w.optimizer, 4, m.hidden_size)
    offload_opt = layout.offload in ("optimizer", "optimizer+params")
    offload_params = layout.offload == "optimizer+params"
    grad_bytes = 0 if stage == 3 else c
    ww, gg, oo = zero_model_states(trainable, n, stage, weight_bytes=c, grad_bytes=grad_bytes, optimizer_bytes=k)
    frozen = frozen_bytes / n if stage == 3 else frozen_bytes
    h2 = m.hidden_size ** 2  # bucket sizes of the generated config (`artifacts.deepspeed_config`)
    if stage == 3:
        part["gathered_params"] += 4 * m.largest_module_params() + c * int(0.9 * h2)  # largest layer + prefetch
        part["comm_buffers"] = 2 * c * h2          # reduce bucket, double-buffered
    else:
        part["comm_buffers"] = 3 * c * h2          # reduce bucket (double-buffered) + all-gather bucket
    if offload_opt:
        oo, gg = 0.0, 0.0  # gradients stream into the fp32 partition in host memory
    if offload_params:
        ww, frozen = 0.0, 0.0
    assign_trainable(w, part, ww, gg, oo, frozen)
    if not offload_opt:
        return 0.0
    # Processes per node: one per GPU, or the CPU processes of a run over gloo (a CPU layout has none).
    per_node = layout.gpus_per_node or max(1, layout.data_parallel // max(1, layout.nodes))
    cpu: float
    if stage == 3:
        cpu, _, _ = deepspeed_zero3_mem_needs(trainable, m.largest_module_params(), per_node,
                                              layout.nodes, True, offload_params, True, BUFFER_FACTOR)
    else:
        # DeepSpeed's ZeRO-2 estimate: 16 bytes of offloaded fp32 state per parameter, or the fp32
        # copies the ranks build at start-up if larger; the states divided over the nodes as its
        # ZeRO-3 estimate does, the start-up copies counted for this node's ranks.
        cpu = trainable * max(4 * per_node, 16 / layout.nodes) * BUFFER_FACTOR
    if offload_params:
        cpu += frozen_bytes / layout.nodes * BUFFER_FACTOR
    return float(cpu)


def _random_init(recipe: Recipe) -> bool:
    from recipeforge.components.tiny_spec import tiny_arch

    return tiny_arch(recipe.model.name_or_path) is not None or recipe.model.init == "random"
