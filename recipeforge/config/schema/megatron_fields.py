"""What the megatron backend does with every recipe field: mapped, refused, or ignored for a reason.

One table, `FIELDS`, keyed by the recipe's field path (``train.optimizer``; a section path such as
``dpo`` covers everything under it). `tests/unit/backends/test_megatron_fields.py` walks the whole
recipe schema and fails on a field that has no entry, so a new field must say what Megatron does
with it. `megatron_problems(recipe)` returns the refusals that apply to one recipe (values outside
what Megatron runs), for validation to report before anything is launched. Pure: no Megatron import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel

HF = "single, ddp, deepspeed and fsdp"  # the backends built on the transformers/TRL trainers


@dataclass(frozen=True)
class Field:
    """How one recipe field reaches Megatron.

    kind: ``mapped`` (``target`` names the Megatron-Bridge attribute(s) or recipeforge step that
    carries it), ``refused`` (a value other than the default, or outside ``allowed``, is an error
    with ``why``), or ``ignored`` (``why`` says why the field has no meaning for Megatron)."""

    kind: str
    target: str = ""
    why: str = ""
    allowed: tuple = ()


def mapped(target: str, *, allowed: tuple = (), why: str = "") -> Field:
    """A field carried into Megatron's configuration (`allowed`: the only values it runs)."""
    return Field("mapped", target, why, allowed)


def refused(why: str) -> Field:
    """A field Megatron cannot honour: any value but the default is refused with `why`."""
    return Field("refused", why=why)


def ignored(why: str) -> Field:
    """A field with no meaning for Megatron, with the reason."""
    return Field("ignored", why=why)


DATA_STEP = "the shared data step (components.lm_data) whose rows are written for Megatron (components.megatron_data)"
PLANNER = "the planner and launcher (the same for every backend)"

FIELDS: dict[str, Field] = {
    "stage": mapped("the Megatron stage runner (stages.megatron_lm)", allowed=("pretrain", "sft"),
                    why=f"Megatron-Bridge runs pretraining and SFT here; the other stages (DPO, GRPO, distillation, "
                        f"...) run on {HF}"),
    "name": ignored("names the run directory, not a training setting"),
    "description": ignored("documentation for the model card"),
    "allow_code": ignored("read while the recipe is loaded (code in dataset formats and rewards)"),
    "lock": ignored("the environment the recipe was resolved in, compared by `train` before any backend runs"),
    # model
    "model.name_or_path": mapped("AutoBridge.from_hf_pretrained (before launch); the shared data step's tokenizer, saved with Megatron's data, is tokenizer.tokenizer_model"),
    "model.revision": mapped("import_ckpt(revision=...); the converted checkpoint's cache key"),
    "model.tokenizer": mapped("the shared data step, whose tokenizer Megatron's data keeps (tokenizer.tokenizer_model)"),
    "model.dtype": mapped("model.bf16 / fp16 / params_dtype, optimizer.bf16 / fp16, mixed_precision"),
    "model.attn_implementation": mapped(
        "Megatron-Core attention through Transformer Engine", allowed=("auto",),
        why=f"Megatron-Core chooses its attention kernels through Transformer Engine; model.attn_implementation "
            f"applies on {HF}"),
    "model.trust_remote_code": mapped("AutoBridge.from_hf_pretrained(trust_remote_code=...)"),
    "model.special_tokens": refused(
        "the megatron backend trains the vocabulary of the converted checkpoint; new tokens need new embedding rows "
        f"there. Save a tokenizer and model with them first, or use one of {HF}"),
    **{f"model.vision.{key}": refused(
        "vision-language models train on the Hugging Face backends (single, ddp, deepspeed, fsdp); the megatron "
        "backend trains causal language models") for key in
       ("train_tower", "train_projector", "min_pixels", "max_pixels", "images_per_sample")},
    "model.tokens": refused(
        "the megatron backend trains the vocabulary of the converted checkpoint; model.tokens needs new embedding "
        f"rows (runs on {HF})"),
    "model.eot_tokens": refused(
        f"the megatron backend takes the turn-end and stop tokens from the checkpoint's tokenizer; model.eot_tokens "
        f"runs on {HF}"),
    "model.init": refused(
        f"the megatron backend starts from the checkpoint converted from `name_or_path`; model.init: random "
        f"applies on {HF}"),
    "model.max_position_embeddings": refused(
        f"Megatron-Bridge takes the context length from the checkpoint's config; model.max_position_embeddings "
        f"applies on {HF}"),
    # adapter
    "adapter.type": mapped("peft (megatron.bridge.peft.lora.LoRA)", allowed=("none", "lora"),
                           why=f"QLoRA (4/8-bit base weights through bitsandbytes) runs on {HF}"),
    "adapter.r": mapped("peft.dim"),
    "adapter.alpha": mapped("peft.alpha"),
    "adapter.dropout": mapped("peft.dropout"),
    "adapter.target_modules": mapped("peft.target_modules (Megatron-Core names: linear_qkv, linear_proj, "
                                     "linear_fc1, linear_fc2)"),
    "adapter.modules_to_save": refused(f"Megatron-Bridge's LoRA trains adapters only; adapter.modules_to_save "
                                       f"(fully trained extra modules) applies on {HF}"),
    "adapter.use_rslora": refused(f"Megatron-Bridge's LoRA scales by alpha / r; rank-stabilised LoRA applies on {HF}"),
    "adapter.use_dora": refused(f"DoRA is not wired to the megatron backend; it applies on {HF}"),
    "adapter.quant": ignored("used by adapter.type: qlora only, which the megatron backend refuses"),
    # data: tokenized, masked and packed once, for every backend
    "data.datasets": mapped(DATA_STEP),
    "data.eval_datasets": mapped(DATA_STEP + "; validation.eval_iters"),
    "data.mix_stopping": mapped(DATA_STEP + " (the weighted mix is drawn once, for every backend)"),
    "data.val_size": mapped(DATA_STEP + "; validation.eval_iters"),
    "data.sequence_len": mapped("model.seq_length, dataset.seq_length, offline_packing_specs.packed_sequence_size"),
    "data.packing": mapped(DATA_STEP + " (several samples per row, or one)"),
    "data.chat_template": mapped(DATA_STEP),
    "data.template_check": mapped(DATA_STEP + " (the train-versus-serve template check runs before it)"),
    "data.dedup": mapped(DATA_STEP + " (duplicate rows are dropped before tokenization, for every backend)"),
    "data.train_on_inputs": mapped(DATA_STEP + " (the loss mask)"),
    "data.truncation": mapped(DATA_STEP),
    "data.shuffle": mapped("dataset.max_train_samples (Megatron-Bridge reshuffles the packed rows each epoch)",
                           allowed=(True,),
                           why=f"Megatron-Bridge's packed dataset always shuffles its rows each epoch; "
                               f"data.shuffle: false applies on {HF}"),
    "data.num_proc": mapped(DATA_STEP),
    "data.cache_dir": mapped(DATA_STEP),
    **{f"data.{key}": refused("Megatron-Bridge trains on its own indexed dataset, written whole before the job; "
                              f"streamed corpora train on {HF}") for key in ("streaming", "stream_window", "stream_log")},
    # train
    "train.epochs": mapped("train.train_iters (epochs x rows / global batch)"),
    "train.max_steps": mapped("train.train_iters"),
    "train.global_batch_size": mapped("train.global_batch_size"),
    "train.micro_batch_size": mapped(
        "train.micro_batch_size (1: a packed row per micro batch)", allowed=("auto", 1),
        why="Megatron-Bridge trains packed rows one per micro batch (THD layout); set train.micro_batch_size: "
            "auto or 1 (the global batch is unchanged)"),
    "train.learning_rate": mapped("optimizer.lr"),
    "train.optimizer": mapped(
        "optimizer.optimizer (adam with decoupled weight decay = AdamW, or sgd)",
        allowed=("adamw", "adamw_fused", "sgd"),
        why=f"Megatron-Core's optimizers are Adam/AdamW and SGD; bitsandbytes, torchao, Adafactor and Lion "
            f"optimizers run on {HF}"),
    "train.scheduler": mapped("scheduler.lr_decay_style (+ lr_wsd_decay_iters for wsd)"),
    "train.warmup_ratio": mapped("scheduler.lr_warmup_iters"),
    "train.warmup_steps": mapped("scheduler.lr_warmup_iters"),
    "train.decay_ratio": mapped("scheduler.lr_wsd_decay_iters (wsd only)"),
    "train.weight_decay": mapped("optimizer.weight_decay, scheduler.start/end_weight_decay"),
    "train.adam_beta1": mapped("optimizer.adam_beta1"),
    "train.adam_beta2": mapped("optimizer.adam_beta2"),
    "train.max_grad_norm": mapped("optimizer.clip_grad"),
    "train.gradient_checkpointing": mapped("model.recompute_granularity / recompute_method / recompute_num_layers"),
    "train.checkpoint_every": mapped("model.recompute_method: block, recompute_num_layers"),
    "train.activation_offloading": refused(
        f"the megatron backend does not switch on Megatron-Core's activation CPU offloading; it applies on {HF}"),
    "train.precision": mapped(
        "mixed_precision (bf16_mixed / fp16_mixed: fp32 main weights)", allowed=("auto", "mixed"),
        why=f"Megatron-Bridge keeps fp32 main weights (mixed precision); pure bf16 training applies on {HF}, "
            f"fp8 (torchao's float8 linear layers) on single, ddp and fsdp: Megatron's own FP8 goes through "
            f"Transformer Engine, which this backend does not configure"),
    "train.fp8.scaling": ignored("used with train.precision: fp8 only, which the megatron backend refuses"),
    "train.fp8.all_gather": ignored("used with train.precision: fp8 only, which the megatron backend refuses"),
    "train.tf32": refused(f"Megatron-Bridge does not expose a TF32 switch; train.tf32 applies on {HF}"),
    "train.seed": mapped("rng.seed, dataset.seed"),
    "train.logging_steps": mapped("logger.log_interval"),
    "train.eval_steps": mapped("validation.eval_interval"),
    "train.load_best_model_at_end": refused(
        f"Megatron-Bridge exports the last checkpoint; train.load_best_model_at_end applies on {HF}"),
    "train.metric_for_best_model": ignored("used with train.load_best_model_at_end only, which is refused"),
    "train.divergence.stop_on_nan": mapped("ddp.check_for_nan_in_grad, rerun_state_machine.check_for_nan_in_loss"),
    "train.divergence.spike_factor": refused(f"the loss-spike watch is a trainer callback of {HF}"),
    "train.divergence.spike_window": refused(f"the loss-spike watch is a trainer callback of {HF}"),
    "train.divergence.spike_patience": refused(f"the loss-spike watch is a trainer callback of {HF}"),
    "train.divergence.on_spike": refused(f"the loss-spike watch is a trainer callback of {HF}"),
    "train.unfrozen_parameters": refused(f"training only the parameters selected by name runs on {HF}"),
    "train.optimizer_in_backward": refused("Megatron-Core's distributed optimizer steps the whole model after the "
                                           f"backward pass; stepping each parameter inside it runs on {HF}"),
    "train.qat": refused("torchao's fake quantization swaps torch.nn.Linear layers, and Megatron-Core builds its "
                         f"own; quantization-aware training runs on {HF}"),
    # distributed / hardware
    "distributed.backend": mapped(PLANNER),
    "distributed.preset": mapped(PLANNER + " (tp{T}_pp{P}[_offload])"),
    "distributed.zero_stage": refused("ZeRO stages are DeepSpeed's; the megatron backend shards with its "
                                      "distributed optimizer (use backend: deepspeed for a ZeRO stage)"),
    "distributed.offload": mapped(
        "optimizer.optimizer_cpu_offload (Megatron-Core's optimizer states and step on the CPU)",
        allowed=("auto", "none", "optimizer"),
        why="Megatron-Core offloads optimizer states, not parameters; optimizer+params runs on deepspeed and fsdp"),
    "distributed.expert_parallel": refused("expert parallel is planned for the fsdp backend (transformers' "
                                           "expert-parallel experts); Megatron-Core's expert_model_parallel_size "
                                           "is not configured here"),
    "moe": refused(f"the moe section sets up transformers' MoE models (router, expert LoRA, expert load) on {HF}; "
                   "Megatron-Core builds its own MoE layers from the model's provider"),
    "distributed.tensor_parallel": mapped("model.tensor_model_parallel_size (sequence_parallel when > 1)"),
    "distributed.pipeline_parallel": mapped("model.pipeline_model_parallel_size"),
    "distributed.context_parallel": mapped(
        "model.context_parallel_size (1)", allowed=("auto", 1),
        why="context parallel runs on backend: fsdp (accelerate ParallelismConfig.cp_size)"),
    "distributed.data_parallel_replicate": mapped(
        PLANNER + " (Megatron's data-parallel size is what TP x PP leave)", allowed=("auto", 1),
        why="replicate / shard sizes are FSDP2's mesh (backend: fsdp)"),
    "distributed.data_parallel_shard": mapped(
        PLANNER + " (Megatron's data-parallel size is what TP x PP leave)", allowed=("auto",),
        why="replicate / shard sizes are FSDP2's mesh (backend: fsdp)"),
    "distributed.fsdp_sharding": refused("FSDP sharding applies on backend: fsdp"),
    "distributed.memory_headroom": mapped(PLANNER),
    "distributed.timeout_minutes": mapped("the process group's timeout (recipeforge's worker initialises it)"),
    "distributed.max_restarts": mapped("torchrun --max-restarts (each restart resumes from the newest checkpoint)"),
    "distributed.rdzv_backend": mapped("torchrun --rdzv-backend"),
    "distributed.rdzv_endpoint": mapped("torchrun --rdzv-endpoint"),
    "distributed.rdzv_id": mapped("torchrun --rdzv-id"),
    "distributed.launcher": mapped("who starts the workers: torchrun, or Ray Train's TorchTrainer (launcher: ray)"),
    "distributed.ray_address": mapped("the Ray cluster of launcher: ray"),
    "hardware": mapped(PLANNER),
    "kernels": refused(f"kernels patch Hugging Face modules; Megatron-Core uses Transformer Engine's fused kernels. "
                       f"kernels apply on {HF}"),
    # logging
    "logging.tensorboard": mapped("logger.tensorboard_dir (RUN/tensorboard)"),
    "logging.wandb.project": mapped("logger.wandb_project"),
    "logging.wandb.entity": mapped("logger.wandb_entity"),
    "logging.wandb.name": mapped("logger.wandb_exp_name"),
    "logging.wandb.mode": mapped("WANDB_MODE in the workers' environment"),
    "logging.wandb.tags": refused(f"Megatron-Bridge's wandb logger takes no tags; logging.wandb.tags applies on {HF}"),
    "logging.mlflow.tracking_uri": mapped("logger.mlflow_tracking_uri"),
    "logging.mlflow.experiment": mapped("logger.mlflow_experiment"),
    "logging.progress_bar": ignored("Megatron-Bridge prints a line every log_interval steps; it has no progress bar"),
    # output
    "output.dir": mapped("the run directory: checkpoint.save / load (RUN/checkpoints), final/ export"),
    "output.save_steps": mapped("checkpoint.save_interval"),
    "output.save_total_limit": mapped("checkpoint.most_recent_k"),
    "output.resume": mapped(
        "checkpoint.load (auto: RUN/checkpoints; never: start from the converted base)", allowed=("auto", "never"),
        why="the megatron backend resumes from its own checkpoints (output.resume: auto); a named checkpoint "
            f"applies on {HF}"),
    "output.max_shard_size": refused("final/ is exported by Megatron-Bridge's save_hf_pretrained, which picks "
                                     f"its own file sizes; output.max_shard_size applies on {HF}"),
    "output.merge_adapter": mapped("recipeforge's LoRA merge of final/ (the adapter exported by "
                                   "AutoBridge.export_adapter_ckpt)"),
    "output.push_to_hub": mapped("recipeforge's upload of the exported final/ (or merged/) after the job "
                                 "(tools.hub), as for every backend"),
    # eval
    "eval": mapped("recipeforge's lm-eval evaluation of the exported final/ after the job (tools.evaluation), as "
                   "for every backend; Megatron's own checkpoints are not Hugging Face weights, so eval.at_checkpoints "
                   "finds none to evaluate"),
    # other stages' sections
    "dpo": ignored("DPO runs on other backends (stage is refused)"),
    "grpo": ignored("GRPO runs on other backends (stage is refused)"),
    "orpo": ignored("ORPO runs on other backends (stage is refused)"),
    "kto": ignored("KTO runs on other backends (stage is refused)"),
    "cpo": ignored("CPO runs on other backends (stage is refused)"),
    "reward": ignored("reward-model training runs on other backends (stage is refused)"),
    "distill": ignored("distillation runs on other backends (stage is refused)"),
    "rloo": ignored("RLOO runs on other backends (stage is refused)"),
}


def entry(path: str) -> Field | None:
    """The entry for `path` (``a.b.c``), or the entry of the nearest section above it."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        found = FIELDS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _values(obj: BaseModel, path: str):
    """(path, value, default) of every field under `obj` (a pydantic model), lists element-wise."""
    from pydantic import BaseModel

    for name, info in type(obj).model_fields.items():
        value = getattr(obj, name)
        key = f"{path}{name}"
        if isinstance(value, BaseModel):
            yield from _values(value, key + ".")
            continue
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        yield key, value, default


def megatron_problems(recipe) -> list[tuple[str, str]]:
    """The (key, message) refusals of `recipe` on the megatron backend: refused fields set to a value
    other than their default, and mapped fields set outside the values Megatron runs."""
    problems = []
    t, d = recipe.train, recipe.distributed
    if t.optimizer == "sgd" and d.offload == "optimizer":
        problems.append(("distributed.offload", "distributed.offload: optimizer needs train.optimizer: adamw on the "
                         "megatron backend (Megatron-Core offloads Adam's states to the CPU, not SGD's)"))
    for key, value, default in _values(recipe, ""):
        found = entry(key)
        if found is None or found.kind == "ignored":
            continue
        if found.kind == "mapped":
            if found.allowed and value not in found.allowed:
                problems.append((key, f"{key}: {value!r} is not supported on the megatron backend: {found.why}"))
        elif value != default and value not in (None, (), {}, []):
            problems.append((key, f"{key} is not supported on the megatron backend: {found.why}"))
    return problems
