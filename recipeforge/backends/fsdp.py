"""FSDP2 through Accelerate's FSDP plugin: full / hybrid sharding, auto-wrap by decoder layer,
activation checkpointing, CPU offload; sharded checkpoints, consolidated final/. With tensor or
context parallel in the plan, the mesh is accelerate's ParallelismConfig (`backends.parallelism`).

GPUs (NCCL) and the CPU (gloo) take the same path. Accelerate turns its state into FSDP only from a
GPU-kind distributed type (MULTI_GPU, ...); a CPU worker's state is MULTI_CPU, with which the trainer
would silently run plain DDP with every parameter whole. So on the CPU the worker builds the process
state first and names it MULTI_GPU (`setup_worker`): Accelerate then sets up FSDP2 from it exactly as
on GPUs (`fully_shard` over a gloo device mesh, sharded DCP checkpoints, the full state dict gathered
for final/), and the trainer is told to use that configured state. backend.json records the DTensor
placements the run really had.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, common_report, full_state_dict_save, streamed_final_save
from recipeforge.capabilities import BackendCapabilities, Preset
from recipeforge.plan.backend_spec import Candidate, CpuSpread
from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.memory import (Layout, assign_trainable, foreach_temp, optimizer_state_bytes,
                                     quantized_bytes_per_param)
from recipeforge.plan.train_phase import Gathered
from recipeforge.plan.types import BackendPart, Plan

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer
    import torch

    from recipeforge.config.schema import DistributedConfig, Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.workload import Workload
    from recipeforge.stages.context import StageContext, WorkerHooks

NAME = "fsdp"


@dataclass(frozen=True)
class FSDPPart(BackendPart):
    """FSDP2's part of a plan: the sharding it runs and its device mesh (Accelerate's ParallelismConfig:
    replicas x GPUs each replica shards over; tensor and context sizes are the plan's own)."""

    sharding: str = "full_shard"   # full_shard | shard_grad_op | hybrid_shard
    dp_replicate: int = 1          # replicas (hybrid sharding): ParallelismConfig.dp_replicate_size
    dp_shard: int = 1              # GPUs a replica shards over: ParallelismConfig.dp_shard_size

    def rows(self) -> list[tuple[str, str]]:
        mesh = f", {self.dp_replicate} replicas x {self.dp_shard}" if self.dp_replicate > 1 else ""
        return [("fsdp sharding", f"{self.sharding}{mesh}")]


def fsdp_part(plan: Plan) -> FSDPPart:
    """FSDP2's part of `plan` (the part an FSDP plan carries: `plan_part_type`)."""
    part = plan.backend_part
    assert isinstance(part, FSDPPart), f"a {plan.backend} plan has no FSDP sharding"
    return part


def preset_name(sharding: str, offload: str) -> str:
    """The preset name of an FSDP sharding strategy and offload."""
    return f"fsdp_{sharding}" + ("_offload" if offload != "none" else "")


PRESETS = tuple(Preset(preset_name(sh, o), NAME, sharding=sh, offload=o) for sh, o in (
    ("shard_grad_op", "none"), ("full_shard", "none"), ("hybrid_shard", "none"), ("full_shard", "optimizer+params")))


def cpu_settings(dist: DistributedConfig) -> tuple[str, str, str]:
    """(sharding, offload, preset) of FSDP2 on the CPU: the recipe's preset or pins, else full sharding
    without offload. One machine has no replicas to shard within, so hybrid sharding is full sharding."""
    if dist.preset:
        from recipeforge.plan.presets import get_preset

        p = get_preset(dist.preset, backend=NAME)
        assert p.sharding is not None  # every FSDP preset names its sharding (`PRESETS`)
        sharding, offload = p.sharding, p.offload
    else:
        sharding, offload = dist.fsdp_sharding, dist.offload if dist.offload != "auto" else "none"
    sharding = "full_shard" if sharding == "hybrid_shard" else sharding
    return sharding, offload, preset_name(sharding, offload)


class FSDPBackend(BackendSpec):
    """Fully sharded data parallel (FSDP2, ``fully_shard``) via Accelerate."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "FSDP2 (fully_shard) through Accelerate; NCCL on GPUs, gloo on the CPU",
        quantization_bits=(4,), offload=("none", "optimizer+params"),
        parallel_sizes=("tensor_parallel", "context_parallel", "data_parallel_replicate", "data_parallel_shard",
                        "expert_parallel"),
        cpu_parallel_sizes=("tensor_parallel", "expert_parallel"), cpu_offload=("none",),
        presets=tuple(p.name for p in PRESETS),
        why={"cpu_offload": "FSDP2 offload moves weights between an accelerator and host memory; on the CPU "
                            "they are in host memory already (the CPUOffloadPolicy of torch needs an accelerator)",
             "cpu_parallel": "on the CPU every process shards the model (tensor or expert parallel inside); context "
                             "parallel (ring attention) needs CUDA, and replica/shard mesh sizes are for GPU nodes",
             "quant_bits": "FSDP shards 4-bit weights stored as bf16/fp16 words (bnb_4bit_quant_storage); "
                           "8-bit weights are int8 with per-row scales and do not shard",
             "offload": "FSDP2's CPU offload moves parameters, gradients and optimizer states together"})
    presets = PRESETS
    plan_part_type = FSDPPart
    trainer_holds_weights = False

    # -- planning ---------------------------------------------------------------------------------
    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        out = []

        def add(tier: int, within: float, why: str, sharding: str, offload: str = "none", **kw: int) -> None:
            layout = Layout(NAME, preset_name(sharding, offload), data_parallel=g, fsdp_sharding=sharding,
                            offload=offload, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node, **kw)
            out.append(Candidate(layout, tier, why, within))

        if g > 1 or pinned:
            add(2, 0, "optimizer states and gradients sharded; weights gathered once per step", "shard_grad_op")
            add(3, 0, "weights, gradients and optimizer states sharded; weights gathered per layer "
                      "(1.5x DDP traffic)", "full_shard")
            if hw.nodes > 1 and pinned:
                add(3, 0.5, "sharded within each node, replicated across nodes", "hybrid_shard",
                    dp_replicate=hw.nodes)
        if g > 1 and dist is not None:
            out += self._parallel_candidates(w, hw, dist)
        add(7, 0, "FSDP2 with parameters, gradients and optimizer states in CPU memory", "full_shard",
            offload="optimizer+params")
        return out

    def _parallel_candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig) -> list[Candidate]:
        """FSDP2 with tensor and/or context parallel (`plan.parallel_layouts.splits`), after the layouts
        that shard only data: planned when a model's layers or a sequence's activations need them."""
        from recipeforge.plan.parallel_layouts import splits

        found, _ = splits(w.model, hw, dist, seq_len=w.seq_len, stage=w.stage, adapter=w.adapter,
                          attention=w.attn_implementation, packing=w.packing)
        out = []
        for s in found:
            parts = []
            if s.tensor_parallel > 1:
                parts.append(f"tensor parallel {s.tensor_parallel} (the model's tensor-parallel plan) splits the "
                             "heads, MLP columns and their activations")
            if s.context_parallel > 1:
                parts.append(f"context parallel {s.context_parallel} (ring attention) splits each sequence and "
                             "its activations")
            why = "; ".join(parts) + f"; FSDP2 shards over {s.dp_shard}" + (
                f" x {s.dp_replicate} replicas" if s.dp_replicate > 1 else "")
            sharding = "hybrid_shard" if s.dp_replicate > 1 else "full_shard"
            out.append(Candidate(Layout(NAME, preset_name(sharding, "none"), data_parallel=s.data_parallel,
                                        tensor_parallel=s.tensor_parallel, context_parallel=s.context_parallel,
                                        dp_replicate=s.dp_replicate, fsdp_sharding=sharding,
                                        nodes=hw.nodes, gpus_per_node=hw.gpus_per_node), 4, why, 1))
        return out

    def cpu_candidate(self, dist: DistributedConfig) -> Candidate:
        sharding, offload, preset = cpu_settings(dist)
        return Candidate(Layout(NAME, preset, offload=offload, fsdp_sharding=sharding, nodes=1, gpus_per_node=0),
                         1, f"FSDP2 ({sharding}) on the CPU (gloo), one process planned")

    def cpu_spread(self, dist: DistributedConfig) -> CpuSpread:
        sharding, offload, preset = cpu_settings(dist)
        # tensor parallel: the recipe pins it; every tp ranks hold one model replica's shards
        tp = dist.pinned_size("tensor_parallel") or 1
        return CpuSpread(preset=preset, offload=offload, fsdp_sharding=sharding, tensor_parallel=tp,
                         part=FSDPPart(sharding))

    def matches_pins(self, layout: Layout, dist: DistributedConfig) -> bool:
        # pinned replicas shard inside each replica: hybrid sharding, whatever fsdp_sharding says
        replicas = (dist.pinned_size("data_parallel_replicate") or 1) > 1
        return layout.fsdp_sharding == dist.fsdp_sharding or (replicas and layout.dp_replicate > 1)

    def shards_weights(self, layout: Layout) -> bool:
        return True

    def plan_shards_weights(self, plan: Plan) -> bool:
        return True

    def rank0_loads_whole(self, w: Workload, layout: Layout) -> bool:
        # Accelerate's cpu_ram_efficient_loading: rank 0 loads the checkpoint and broadcasts each shard; a
        # QLoRA base is quantized as it loads, on every rank
        return w.adapter != "qlora"

    def streams_final_save(self, w: Workload, layout: Layout) -> bool:
        # `outputs.streamed_save`: each DTensor gathered alone; a checkpoint layout that combines
        # tensors (fused MoE experts written back one per expert) takes the gathered state dict
        return not w.model.is_moe

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        return fsdp_states(w, layout, part, trainable, frozen_bytes)

    def gathered(self, w: Workload, layout: Layout, engine_gathered: float) -> Gathered:
        return fsdp_gathered(w, layout)

    def holds_layer_gradient(self, w: Workload) -> bool:
        return True

    def accuracy_band(self, w: Workload, layout: Layout) -> str:
        return "sharded"

    def precision(self, w: Workload) -> str:
        return f"fp32 sharded weights, gradients and optimizer states; {w.dtype} compute on gathered copies"

    def plan_part(self, layout: Layout) -> FSDPPart:
        # the sharding the chosen layout was sized with is the one this backend runs
        return FSDPPart(layout.fsdp_sharding, layout.dp_replicate, layout.data_parallel // max(1, layout.dp_replicate))

    # -- running ----------------------------------------------------------------------------------

    def launcher(self, plan: Plan) -> str:
        # Even one process: FSDP2 needs a launched worker and its process group (one GPU with CPU
        # offload is an FSDP job of one rank; in-process training would drop the plugin).
        return "accelerate"

    def plugin(self, plan: Plan, recipe: Recipe) -> dict[str, Any]:
        """Keyword arguments of Accelerate's ``FullyShardedDataParallelPlugin`` (the planner's)."""
        from recipeforge.backends.artifacts import fsdp_plugin_config

        return fsdp_plugin_config(plan, recipe)

    def _hybrid(self, plan: Plan) -> bool:
        from recipeforge.backends.artifacts import fsdp_sharding

        return fsdp_sharding(plan) == "hybrid_shard"

    def accelerate_config(self, plan: Plan, recipe: Recipe, run_dir: Path) -> dict[str, Any]:
        from recipeforge.backends import parallelism

        if parallelism.expert_parallel(plan):
            # Experts (and FSDP2 over the rest) sharded by transformers at load, as for tensor parallel.
            return {"distributed_type": "MULTI_GPU"}
        if parallelism.tensor_parallel(plan):
            # transformers shards the model at load (tensor plan + FSDP2); Accelerate's FSDP plugin
            # would shard it again, so the job runs as MULTI_GPU with the matching ParallelismConfig.
            return {"distributed_type": "MULTI_GPU", **parallelism.accelerate_parallelism_section(plan)}
        p = self.plugin(plan, recipe)
        fsdp: dict[str, Any] = {"fsdp_version": 2,
                "fsdp_auto_wrap_policy": p["auto_wrap_policy"],
                "fsdp_reshard_after_forward": p["reshard_after_forward"],
                "fsdp_offload_params": p["cpu_offload"],
                "fsdp_state_dict_type": p["state_dict_type"],
                "fsdp_cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                "fsdp_activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(p["transformer_cls_names_to_wrap"])
        out: dict[str, Any] = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        if self._hybrid(plan) and fsdp_part(plan).dp_replicate <= 1:  # a plan without the mesh sizes
            out["parallelism_config"] = {"parallelism_config_dp_replicate_size": plan.nodes,
                                         "parallelism_config_dp_shard_size": plan.gpus_per_node}
        else:
            out.update(parallelism.accelerate_parallelism_section(plan))
        return out

    def setup_worker(self, ctx: StageContext) -> WorkerHooks:
        """On the CPU, the process state Accelerate turns into FSDP (see the module); with tensor
        parallelism, the stage loads the model sharded (`parallelism.load_tensor_parallel`); a 4-bit
        QLoRA base and any random-init model are read or made shard by shard (`sharded_loading`)."""
        from recipeforge.backends import parallelism
        from recipeforge.components.tiny_spec import tiny_arch
        from recipeforge.stages.context import WorkerHooks

        if ctx.plan.device != "cuda":
            configure_cpu_state()

        if parallelism.expert_parallel(ctx.plan):
            return parallelism.expert_parallel_hooks(ctx)
        if parallelism.tensor_parallel(ctx.plan):
            plan = ctx.plan

            def load_sharded(path: str, *, dtype: torch.dtype, attn_implementation: str,
                             revision: str | None = None, trust_remote_code: bool = False) -> Any:
                return parallelism.load_tensor_parallel(path, plan, dtype=dtype,
                                                        attn_implementation=attn_implementation,
                                                        revision=revision, trust_remote_code=trust_remote_code)

            return WorkerHooks(load_sharded=load_sharded)
        recipe = ctx.recipe
        quantized = recipe.adapter.type == "qlora" and recipe.adapter.quant.bits == 4
        random = recipe.model.init == "random" or tiny_arch(recipe.model.name_or_path) is not None
        if quantized or random:
            # No process holds the whole base: placeholders now, shards after `fully_shard`.
            from recipeforge.backends import sharded_hooks

            record: dict[str, int] = {}
            return WorkerHooks(load_sharded=sharded_hooks.loader(ctx, record),
                               prepare_trainer=sharded_hooks.shard_and_fill(ctx, record), makes_random=True)
        return WorkerHooks()

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        from transformers import TrainingArguments

        from recipeforge.backends import parallelism

        if parallelism.tensor_parallel(ctx.plan):
            # A model sharded at load: the Trainer prepares it without Accelerate's FSDP plugin, and
            # checkpoints its weights only (transformers cannot resume such a model's optimizer).
            return {"parallelism_config": parallelism.parallelism_config(ctx.plan), "save_only_model": True,
                    **_cpu_kwargs(ctx.plan)}
        if parallelism.expert_parallel(ctx.plan):
            # Sharded at load too (experts over the ep mesh, FSDP2 over the rest): the Trainer saves the
            # weights, `backends.expert_parallel.attach` the sharded optimizer state next to them.
            return {"save_only_model": True, **_cpu_kwargs(ctx.plan)}
        p = self.plugin(ctx.plan, ctx.recipe)
        config: dict[str, Any] = {"version": 2, "auto_wrap_policy": p["auto_wrap_policy"],
                  "reshard_after_forward": p["reshard_after_forward"], "cpu_offload": p["cpu_offload"],
                  "state_dict_type": p["state_dict_type"],
                  "cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                  "activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            config["transformer_layer_cls_to_wrap"] = p["transformer_cls_names_to_wrap"]
        # FSDP recomputes per wrapped layer itself; the trainer's own switch would add an all-gather.
        ckpt = ("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                else "gradient_checkpointing")
        kwargs: dict[str, Any] = {"fsdp": True, "fsdp_config": config, ckpt: False, **_cpu_kwargs(ctx.plan)}
        if self._hybrid(ctx.plan) and fsdp_part(ctx.plan).dp_replicate <= 1:  # a plan without the mesh sizes
            from accelerate import ParallelismConfig

            kwargs["parallelism_config"] = ParallelismConfig(dp_replicate_size=ctx.plan.nodes,
                                                             dp_shard_size=ctx.plan.gpus_per_node)
        elif parallelism.parallelism_config_kwargs(ctx.plan) is not None:
            # context parallel (cp_size) and/or replicas: Accelerate builds the mesh, the Trainer splits sequences
            kwargs["parallelism_config"] = parallelism.parallelism_config(ctx.plan)
        return kwargs

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        from recipeforge.backends import parallelism

        if parallelism.expert_parallel(ctx.plan):
            # Collective: the expert plan's and FSDP2's DTensor shards gathered into full CPU tensors, in the
            # model's own checkpoint layout (per-expert weights).
            parallelism.original_format(model)
            return full_state_dict_save(ctx, model, tokenizer, gathered_state_dict(trainer.model))
        # Full weights: written tensor by tensor (collective), so rank 0 never holds the whole model.
        streamed = streamed_final_save(ctx, model, tokenizer, "dtensor", trainer.model)
        if streamed is not None:
            return streamed
        if parallelism.tensor_parallel(ctx.plan):
            # Collective: DTensor shards (tensor plan and FSDP2) gathered into full CPU tensors.
            return full_state_dict_save(ctx, model, tokenizer, gathered_state_dict(trainer.model))
        # Collective: the shards are all-gathered into a full CPU state dict on the main process.
        state_dict = trainer.accelerator.get_state_dict(trainer.model)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        report = common_report(trainer)
        model = trainer.model
        params = list(model.parameters())
        report["fsdp_modules"] = sum(1 for m in model.modules() if isinstance(m, FSDPModule))
        report["dtensor_params"] = sum(1 for p in params if isinstance(p, DTensor))
        report["params"] = len(params)
        report["local_param_elements"] = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
                                             for p in params)
        report["full_param_elements"] = sum(p.numel() for p in params)
        # How the parameters really were split: DTensor placements by count, and the mesh they live on.
        dtensors = [p for p in params if isinstance(p, DTensor)]
        placements: dict[str, int] = {}
        for p in dtensors:
            key = ", ".join(str(pl) for pl in p.placements)
            placements[key] = placements.get(key, 0) + 1
        report["placements"] = dict(sorted(placements.items()))
        if dtensors:
            mesh = dtensors[0].device_mesh
            report["mesh"] = {"device_type": mesh.device_type, "shape": list(mesh.shape),
                              "dims": list(mesh.mesh_dim_names or ())}
        pc = getattr(trainer.accelerator, "parallelism_config", None)
        if pc is not None:  # the mesh Accelerate ran (tensor / context parallel, replicas)
            report["parallelism"] = {"dp_replicate": pc.dp_replicate_size, "dp_shard": pc.dp_shard_size,
                                     "tp": pc.tp_size, "cp": pc.cp_size}
        report["tp_size"] = getattr(model, "tp_size", None) or 1
        held = getattr(trainer, "rf_expert_parallel", None)
        if held is not None:  # this rank's experts, read from the model at load (`backends.expert_parallel`)
            report["expert_parallel"] = held
        # QLoRA: bitsandbytes' 4-bit linears, whose packed weights (16-bit words) FSDP2 shards too
        # (bitsandbytes' own class: peft's LoRA wrapper of such a layer is named Linear4bit too)
        quantized = [m for m in model.modules()
                     if type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes")]
        if quantized:
            report["quantized_modules"] = len(quantized)
            report["quantized_dtensor_weights"] = sum(1 for m in quantized if isinstance(m.weight, DTensor))
        return report


def configure_cpu_state() -> None:
    """The process state of a CPU worker, named MULTI_GPU so that Accelerate's state sets up FSDP2 from
    it as on GPUs; the device stays the CPU and the process group gloo (the trainer then uses this
    state: `_cpu_kwargs`)."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    state = PartialState(backend="gloo")
    if state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO):
        state.distributed_type = DistributedType.MULTI_GPU


def _cpu_kwargs(plan: Plan) -> dict[str, Any]:
    """Trainer arguments that keep the state `configure_cpu_state` made (use_cpu would rebuild it)."""
    if plan.device == "cuda":
        return {}
    return {"use_cpu": False, "accelerator_config": {"use_configured_state": True}}


def gathered_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The full state dict of a model whose weights are DTensors (tensor plan, FSDP2), on the CPU.
    Collective: every rank calls it; torch's distributed-checkpoint helper gathers each shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# ----------------------------------------------------------------------------- memory terms

def fsdp_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float) -> float:
    """FSDP2 through Accelerate: trainable parameters are upcast to fp32 and sharded with their
    gradients and optimizer states; compute runs on 16-bit unsharded copies gathered per layer."""
    m, c = w.model, w.compute_bytes
    # FSDP2 shards over the dp_shard x cp mesh (accelerate's `dp_shard_cp`); tensor parallelism splits
    # every sharded weight first (its DTensor shards), so states and gathered layers divide by t too.
    tp, cp = layout.tensor_parallel, layout.context_parallel
    shard = layout.data_parallel // max(1, layout.dp_replicate)
    if layout.fsdp_sharding == "hybrid_shard" and layout.dp_replicate == 1:
        shard = layout.gpus_per_node // (tp * cp)
    n = shard * cp
    ww, gg, oo = zero_model_states(trainable / tp, n, 3, weight_bytes=4, grad_bytes=4,
                                   optimizer_bytes=optimizer_state_bytes(w.optimizer, 4, m.hidden_size))
    frozen = frozen_bytes / (n * tp)
    base_per_param = (frozen_bytes / m.total_params()) if not w.full_finetune else c
    if foreach_temp(w.optimizer) and layout.offload == "none":
        part["optimizer_step"] = oo / 2
    if layout.offload != "none":
        # CPUOffloadPolicy: sharded parameters, gradients and optimizer states live in host memory,
        # plus the 16-bit checkpoint the main process loads before sharding (cpu_ram_efficient_loading)
        cpu = (ww + gg + oo + frozen) * layout.gpus_per_node + m.total_params() * base_per_param / tp
        assign_trainable(w, part, 0.0, 0.0, 0.0, 0.0)
        return cpu
    assign_trainable(w, part, ww, gg, oo, frozen)
    return 0.0


def fsdp_gathered(w: Workload, layout: Layout) -> Gathered:
    """What FSDP2 holds unsharded at each moment of the step (bytes per GPU), as torch's FSDP2 moves it
    (`FSDPMemTracker` on a fake process group shows each; bench/plan_vs_tracker.py).

    The root (embeddings, output layer, final norm) is not resharded after forward, as backward needs
    it at once. A layer's all-gather output is kept until the next layer's all-gather has been copied
    out (the root's too: in the first layer's forward both are alive), and backward prefetches the
    next layer's while the current one is gathered. A layer's gradients come out unsharded; its
    reduce-scatter copies them into an input buffer that is kept until the next layer's
    reduce-scatter starts, so every layer after the first of backward meets the previous one's
    buffer. The root's gradients (the output
    layer's from its backward on, the embeddings' at the end) wait for the root's reduce-scatter
    after the whole backward. `shard_grad_op` (reshard_after_forward=False) keeps every layer
    unsharded from its forward to its backward. Tensor parallelism splits all of it."""
    from recipeforge.plan.fp8 import gathered_layer_saving

    root, layer, grads = _fsdp_unsharded(w)
    layer -= gathered_layer_saving(w, layout.tensor_parallel)  # train.precision fp8: converted weights gathered in float8
    m, c = w.model, w.compute_bytes
    head_grad = c * m.output_width * m.hidden_size if w.full_finetune else 0.0
    embed_grad = c * m.embedding_params() if w.full_finetune and m.head_params() else 0.0  # tied: the head's
    if layout.fsdp_sharding == "shard_grad_op":
        every = root + m.num_layers * layer
        out = Gathered(forward=every + layer, forward_end=every, backward=every, layer=every,
                       layer_later=every + grads, layer_gradients=grads, root_end=every + embed_grad + grads,
                       output_gradient=head_grad)
    else:
        # backward prefetches the next layer while there is one: the last layer's backward has it from
        # two layers on, a later layer's (with the previous reduce-scatter input) from three
        prefetch_first, prefetch_later = (layer if m.num_layers > n else 0.0 for n in (1, 2))
        out = Gathered(forward=root + max(root, layer) + 2 * layer, forward_end=root + layer, backward=root + layer,
                       layer=root + layer + prefetch_first, layer_later=root + layer + prefetch_later + grads,
                       layer_gradients=grads, root_end=root + embed_grad + grads, output_gradient=head_grad)
    return out.divided(layout.tensor_parallel)


def _fsdp_unsharded(w: Workload) -> tuple[float, float, float]:
    """Bytes of FSDP2's root gathered, one decoder layer gathered, and one layer's unsharded
    gradients. Gathered copies keep each part's own dtype: QLoRA's embeddings, output layer and norms
    are not quantized (and stay in the compute dtype, the 4-bit weights' storage dtype), its decoder
    linears are. Gradients come out in the compute dtype (Accelerate sets reduce dtype = param dtype)."""
    m, c = w.model, w.compute_bytes
    root = (m.embedding_params() + m.head_params() + m.final_norm_params()) * c
    if w.adapter == "qlora":
        linear = m.quantized_params() / m.num_layers
        layer = (linear * quantized_bytes_per_param(w.quant_bits, w.double_quant, m.hidden_size)
                 + (m.layer_params() - linear) * c)
    else:
        layer = m.layer_params() * c
    trainable_layer = m.layer_params() if w.full_finetune else w.trainable_params() / max(1, m.num_layers)
    return root, layer, c * trainable_layer
