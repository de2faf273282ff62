"""Per-GPU memory of one training step, by component, for a workload on a distributed layout.

Every formula is documented with its source in docs/planner.md. Amounts are bytes; the peak is

    persistent (weights, gradients, optimizer, adapter, reference model, teacher model, comm buffers, rollout
                engine, runtime)
    + max(forward/backward: its largest moment (`train_phase`: activations, logits, autocast's
                              weight copies, weight gradients as backward makes them, gathered
                              parameters),
          optimizer step: temporaries (+ paged optimizer states),
          generation: KV cache + gathered parameters,
          a colocated distillation teacher's forward: its layer, logits and top-k (`plan.teacher`))
    + allocator reserve (free blocks the caching allocator keeps at the train phase's fullest moment
                         that are too small for its requests: `activations.idle_at_loss`)

because activations are freed before the optimizer step and GRPO generates outside the training step.
Where torch owns the gradients (one GPU, DDP, FSDP2) they are allocated during backward and freed by
`zero_grad(set_to_none=True)`: with one micro batch per step they never coexist with a full set of
activations, so they count in the optimizer step (and in forward/backward only from the second
micro batch of an accumulation cycle). Paged optimizer states live in unified memory and are paged in
for the step only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipeforge.capabilities import BackendCapabilities, spec_capabilities
from recipeforge.plan.activations import (Activations, activation_bytes, activation_split,  # noqa: F401
                                          idle_at_loss, kv_cache_bytes, layer_activation_bytes_per_token,
                                          logits_bytes, logits_phases, widest_linear)
from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.hardware import GIB
from recipeforge.plan.linear import quantized_bytes_per_param as quantized_bytes_per_param  # re-exported
from recipeforge.plan.offload_activations import offload_note
from recipeforge.plan.optim_in_backward import book_in_backward
from recipeforge.plan.teacher_memory import book_teacher
from recipeforge.plan.train_phase import Copies, LayerGradient, Moment, Step, reserved_peak, train_peak
from recipeforge.plan.vision_activations import vision_activation_bytes
from recipeforge.plan.workload import Workload

CUDA_RUNTIME = 0.75 * GIB      # CUDA context, cuBLAS/cuDNN workspaces (not in torch's allocator stats)
NCCL_BUFFERS = 0.5 * GIB       # communicator buffers once more than one process trains
BUFFER_FACTOR = 1.5            # DeepSpeed's additional_buffer_factor on its host-memory estimates

PERSISTENT = ("weights", "gradients", "optimizer", "adapter", "reference_model", "teacher_model", "comm_buffers",
              "rollout_engine", "runtime")
TRAIN_PHASE = ("activations", "vision_activations", "logits", "teacher_topk", "gathered_params", "autocast_weights",
               "output_gradient", "layer_gradient", "in_backward_step")
OPTIMIZER_PHASE = ("optimizer_step", "paged_optimizer")
GENERATION_PHASE = ("kv_cache", "generation_params")
TEACHER_PHASE = ("teacher_forward",)
LOAD_PHASE = ("quantized_load",)
COMPONENTS = (PERSISTENT + TRAIN_PHASE + OPTIMIZER_PHASE + GENERATION_PHASE + TEACHER_PHASE + LOAD_PHASE
              + ("allocator_reserve",))
PAGED_OPTIMIZERS = ("paged_adamw_8bit", "paged_adamw_32bit")
TORCHAO_STATE_BYTES = {"adamw_torchao_8bit": 1.0, "adamw_torchao_4bit": 0.5}  # bytes per value of each state


@dataclass(frozen=True)
class Layout:
    """How the model is spread: a backend with its preset, parallel sizes and offload."""

    backend: str                    # a registered backend spec's name
    preset: str | None
    data_parallel: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    zero_stage: int | None = None
    offload: str = "none"           # none | optimizer | optimizer+params
    fsdp_sharding: str = "full_shard"
    nodes: int = 1
    gpus_per_node: int = 1
    context_parallel: int = 1       # sequence split (FSDP2 + PyTorch context parallel)
    dp_replicate: int = 1           # FSDP2 replicas (hybrid sharding); data_parallel = replicate x shard
    # The spec that offered this layout (a `backend_spec.PlannerSpec`): its memory terms and traits
    # size it. Bound by the planner (`Planners.offered`), never looked up by name here; not part of a
    # layout's identity. Typed loosely: `backend_spec` sizes its layouts with this module, so naming
    # its class here would make the two modules import each other.
    planner: Any = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> Any:
        """The backend spec this layout is sized with; a layout built by hand names its own."""
        if self.planner is None:
            raise TypeError(f"Layout({self.backend!r}, ...) has no planner: build it with planner=<the backend's "
                            "PlannerSpec>, or take it from Planners.offered / Planners.bind")
        return self.planner

    @property
    def capabilities(self) -> BackendCapabilities:
        """The capability record of the spec that offered this layout."""
        return spec_capabilities(self.backend, self.spec)

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    @property
    def label(self) -> str:
        base = f"{self.backend} {self.preset}" if self.preset else self.backend
        if not self.spec.preset_names_sizes:  # Megatron's tp2_pp4 says them already
            base += (f" tp{self.tensor_parallel}" if self.tensor_parallel > 1 else "") + \
                (f" cp{self.context_parallel}" if self.context_parallel > 1 else "")
        return base


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU by component, the peak, and host RAM per node for offloaded states."""

    components: dict[str, float]
    total: float
    cpu_per_node: float = 0.0
    notes: tuple[str, ...] = field(default=())
    train_peak: str = ""            # the moment of forward/backward whose tensors the train-phase parts are

    def gb(self) -> dict[str, float]:
        """Non-zero components and the total in GiB, rounded for display and plan.json."""
        out = {k: round(v / GIB, 2) for k, v in self.components.items() if v > 0}
        out["total"] = round(self.total / GIB, 2)
        return out


# ----------------------------------------------------------------------------- per-parameter bytes

def optimizer_state_bytes(optimizer: str, state_bytes: float, hidden: int) -> float:
    """Optimizer state bytes per trainable element. `state_bytes` is the element size torch
    optimizers keep their states in (the parameter's dtype); bitsandbytes' 8-bit and 32-bit optimizers
    fix their own."""
    if optimizer in ("adamw", "adamw_fused"):
        return 2 * state_bytes                  # exp_avg + exp_avg_sq
    if optimizer == "paged_adamw_32bit":
        return 8.0
    if optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        return 2.0 + 2 * 4 / 2048               # two 8-bit states + an fp32 absmax per 2048-block each
    if optimizer == "lion_8bit":
        return 1.0 + 4 / 2048
    if optimizer in TORCHAO_STATE_BYTES:
        # torchao: two block-quantized states with an fp32 scale per 256-value block (the block size
        # transformers passes); tensors under 4096 values keep full-size states, a negligible share
        return 2 * (TORCHAO_STATE_BYTES[optimizer] + 4 / 256)
    if optimizer == "adafactor":
        return 2 * state_bytes / hidden         # factored second moment: one row + one column per matrix
    if optimizer == "sgd":
        return 0.0                              # no momentum by default
    return 2 * state_bytes


def foreach_temp(optimizer: str) -> bool:
    """Whether the optimizer's step materialises a state-sized temporary."""
    # torch's default (foreach) AdamW materialises one state-sized intermediate list in step();
    # the fused kernel and bitsandbytes' kernels work in place.
    return optimizer == "adamw"


def quantized_model_bytes(w: Workload, other_bytes: float) -> float:
    """A QLoRA base: quantized decoder linears, every other weight at `other_bytes` per parameter."""
    m = w.model
    q = m.quantized_params()  # MoE routers and routed experts are not nn.Linear: bitsandbytes keeps them
    return (q * quantized_bytes_per_param(w.quant_bits, w.double_quant, m.hidden_size)
            + (m.total_params() - q) * other_bytes)


def loads_quantized_shards(w: Workload, layout: Layout) -> bool:
    """Whether each process loads only its shard of a QLoRA base (`backends.sharded_loading`:
    FSDP2 or ZeRO-3 with 4-bit weights and no tensor parallel); elsewhere every process loads it whole."""
    return (w.adapter == "qlora" and w.quant_bits == 4 and _shards_weights(layout)
            and layout.tensor_parallel <= 1)


def tensor_in_flight_bytes(w: Workload, compute_bytes: float) -> float:
    """The largest checkpoint tensor a shard-by-shard load holds whole at once, with its quantized
    copy when it is a quantized linear: the embedding (or output layer), or the widest MLP matrix."""
    m = w.model
    embedding = m.vocab_size * m.hidden_size * compute_bytes
    mlp = max(m.intermediate_size, m.moe_intermediate_size) * m.hidden_size
    quantized = mlp * (compute_bytes + quantized_bytes_per_param(w.quant_bits, w.double_quant, m.hidden_size))
    return max(embedding, quantized)


# ----------------------------------------------------------------------------- the estimate

def estimate(w: Workload, layout: Layout, micro_batch: int, checkpointing: bool, *,
             accumulation: int = 1, gpu_memory: float = 0.0) -> MemoryEstimate:
    """Per-GPU peak memory of `w` on `layout` with `micro_batch` samples per forward pass.

    `gpu_memory` (bytes) sizes a colocated vLLM engine, which reserves its share of the whole GPU.
    """
    m, c = w.model, w.compute_bytes
    part: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    notes: list[str] = []
    psi = m.total_params()
    trainable = w.trainable_params()
    mp = layout.tensor_parallel * layout.pipeline_parallel

    cpu = layout.spec.model_states(w, layout, part, trainable, _frozen_bytes(w, layout, trainable))

    # ---- reference model (DPO, GRPO with a KL term): frozen 16-bit copy, sharded like the weights
    if w.reference_model:
        shards = layout.data_parallel if _shards_weights(layout) else 1
        part["reference_model"] = psi * c / (shards * mp)

    # ---- activations, logits and what else one micro batch's forward and backward hold at their peak
    peak, idle, host = _train_peak(w, layout, micro_batch, checkpointing, part["gathered_params"])
    part.update(peak.parts)
    # a vision-language model's image side: kept from the vision forward to the end of backward, so
    # alive at every moment of the train phase (`vision_activations`)
    part["vision_activations"] = vision_activation_bytes(w, micro_batch, checkpointing)
    if host:
        cpu += host * layout.gpus_per_node
        notes.append(offload_note(part["activations"], host, GIB))

    # a colocated distillation teacher: whole on every GPU, its forward before the student's
    book_teacher(w, part, micro_batch)
    per_micro = w.rollout is not None and w.rollout.per_micro_batch
    _book_rollout(w, layout, part, notes, micro_batch * (1 if per_micro else accumulation), gpu_memory)
    part["runtime"] = (CUDA_RUNTIME + (NCCL_BUFFERS if layout.world_size > 1 else 0.0)) if gpu_memory else 0.0
    _book_paged_optimizer(w, layout, part, notes)
    book_in_backward(w, part, notes)  # train.optimizer_in_backward: one parameter's step at a time
    total = _phase_peak(w, layout, part, accumulation, idle)
    load_peak = _book_quantized_load(w, layout, part, notes)
    if load_peak > total:  # loading is the peak: nothing else exists yet
        notes.append(f"loading the quantized model whole ({part['quantized_load'] / GIB:.1f} GB per GPU) is "
                     "the peak, before it is sharded")
        part["allocator_reserve"] = 0.0
        total = load_peak
    return MemoryEstimate(components=part, total=total, cpu_per_node=cpu, notes=tuple(notes), train_peak=peak.name)


def _frozen_bytes(w: Workload, layout: Layout, trainable: float) -> float:
    """Frozen base weights (adapters), or the frozen rest of the trained weights (full fine-tune)."""
    psi, c = w.model.total_params(), w.compute_bytes
    if w.full_finetune:
        # train.unfrozen_parameters: the frozen rest keeps its 16-bit weights only (0 when all train)
        return (psi - trainable) * c
    if w.adapter == "qlora":
        # peft's prepare_model_for_kbit_training keeps the non-quantized weights in fp32; a sharded base
        # (ZeRO-3, FSDP) keeps them in the compute dtype, the 4-bit weights' storage dtype
        return quantized_model_bytes(w, 4 if not _shards_weights(layout) else c)
    return psi * c


def _book_rollout(w: Workload, layout: Layout, part: dict[str, float], notes: list[str], samples: int,
                  gpu_memory: float) -> None:
    """GRPO rollout on the training GPUs: the KV cache of `samples` sequences or the engine's reserve."""
    if w.rollout is None or not w.rollout.colocated:
        return
    if w.rollout.engine == "hf":
        # TRL generates the completions of all accumulation steps at once
        part["kv_cache"] = kv_cache_bytes(w, samples)
        if _shards_weights(layout):
            # the whole model is gathered to generate
            mp = layout.tensor_parallel * layout.pipeline_parallel
            part["generation_params"] = w.model.total_params() * w.compute_bytes / mp
    elif w.rollout.reserves_memory:
        part["rollout_engine"] = w.rollout.gpu_memory_utilization * gpu_memory
        notes.append(f"{w.rollout.engine} reserves {w.rollout.gpu_memory_utilization:.0%} of each GPU")
    else:
        notes.append(f"the memory of rollout engine {w.rollout.engine} is not estimated")


def _book_paged_optimizer(w: Workload, layout: Layout, part: dict[str, float], notes: list[str]) -> None:
    """Move paged optimizer states from the persistent part to the optimizer step."""
    if w.optimizer in PAGED_OPTIMIZERS and part["optimizer"] and layout.offload == "none":
        if w.optimizer_in_backward and w.full_finetune:
            part["paged_optimizer"], part["optimizer"] = part["optimizer"], 0.0
            return  # paged in one parameter at a time, in backward (`plan.optim_in_backward`)
        # bitsandbytes allocates paged states in CUDA unified memory: they are paged in for step()
        # and out again under pressure, so only the optimizer step needs them on the GPU
        part["paged_optimizer"], part["optimizer"] = part["optimizer"], 0.0
        notes.append(f"paged optimizer states ({part['paged_optimizer'] / GIB:.1f} GB) are resident for the "
                     "optimizer step only")


def _phase_peak(w: Workload, layout: Layout, part: dict[str, float], accumulation: int, idle: float) -> float:
    """Persistent memory plus the largest phase as the caching allocator holds it: the train phase
    with the `idle` free blocks its fullest moment cannot use. Books the allocator reserve, what that
    adds to the allocated peak."""
    # torch-owned gradients are allocated in backward and freed by zero_grad(set_to_none=True)
    deferred = (layout.spec.torch_allocates_gradients and w.full_finetune
                and layout.offload == "none")
    grads = part["gradients"]
    persistent = sum(part[k] for k in PERSISTENT) - (grads if deferred else 0.0)
    train = sum(part[k] for k in TRAIN_PHASE) + (grads if deferred and accumulation > 1 else 0.0)
    step = sum(part[k] for k in OPTIMIZER_PHASE) + (grads if deferred else 0.0)
    generation = sum(part[k] for k in GENERATION_PHASE)
    # the teacher's forward comes before the student's: its top-k is made at its end
    teacher = (sum(part[k] for k in TEACHER_PHASE) + part["teacher_topk"] + (grads if deferred and accumulation > 1
                                                                            else 0.0)) if part["teacher_forward"] else 0.0
    allocated = max(train, step, generation, teacher)
    held = max(train + idle, step, generation, teacher)
    part["allocator_reserve"] = held - allocated
    return persistent + held


def _book_quantized_load(w: Workload, layout: Layout, part: dict[str, float], notes: list[str]) -> float:
    """The peak while a sharded QLoRA base loads (0 where loading is not a candidate peak)."""
    if not (w.adapter == "qlora" and _shards_weights(layout)):
        return 0.0
    c = w.compute_bytes
    if loads_quantized_shards(w, layout):
        # `backends.sharded_loading`: each process reads the checkpoint one tensor at a time,
        # quantizes it and keeps its shard; the shards are the weights term already
        part["quantized_load"] = tensor_in_flight_bytes(w, c)
        notes.append(f"the 4-bit base loads shard by shard: each GPU holds its shard and at most "
                     f"{part['quantized_load'] / GIB:.1f} GB of one checkpoint tensor in flight")
        return part["runtime"] + part["weights"] + part["quantized_load"]
    # transformers loads a quantized checkpoint whole onto every GPU (no zero.Init, no rank-0
    # loading for quantized models); ZeRO-3 partitions it only when the engine starts
    part["quantized_load"] = quantized_model_bytes(w, c)
    return part["runtime"] + part["quantized_load"]


def _train_peak(w: Workload, layout: Layout, micro_batch: int, checkpointing: bool,
                engine_gathered: float) -> tuple[Moment, float, float]:
    """The largest moment of one micro batch's forward and backward (`train_phase`) on `layout`,
    what the caching allocator holds beyond it in blocks it cannot use, and the activation bytes
    TRL's offloading moves to host memory. `engine_gathered`: DeepSpeed's
    gathered buffers, the same throughout the step."""
    m, c = w.model, w.compute_bytes
    tokens = micro_batch * w.sequences_per_sample * w.seq_len
    # Megatron: sequence parallel and a vocab-parallel loss; transformers' plans keep both whole
    sequence_parallel = layout.spec.sequence_parallel
    cp, tp = layout.context_parallel, layout.tensor_parallel
    fp32_weights = autocast_fp32_weights(w, layout)
    # Megatron 1F1B: the first stage keeps p micro batches of L/p layers, i.e. L layers' worth
    act = activation_split(w, tokens, layers=m.num_layers, checkpointing=checkpointing, tensor_parallel=tp,
                           context_parallel=cp, sequence_parallel=sequence_parallel, fp32_weights=fp32_weights)
    host = 0.0
    if w.activation_offloading:  # TRL's offloading: most of them wait in pinned host memory
        from recipeforge.plan.offload_activations import offloaded_activations

        on_gpu, host = offloaded_activations(w, tokens, layers=m.num_layers, checkpointing=checkpointing,
                                             tensor_parallel=tp, context_parallel=cp,
                                             sequence_parallel=sequence_parallel)
        act = Activations(stored=on_gpu, recomputed=0.0, layer=0.0, outside=0.0, norm_backward=0.0)
    logit_tokens = micro_batch * w.sequences_per_sample * w.logit_tokens // cp
    logits = logits_phases(w, logit_tokens, tp if sequence_parallel else 1)
    extra = 0.0
    if w.adapter == "qlora":
        extra += 2 * m.largest_linear_params() * c  # one dequantized weight, forward and backward
    if w.lora_dora:
        extra += m.largest_linear_params() * c      # DoRA's weight norm needs the full matrix
    if w.fp8_layer_params:
        from recipeforge.plan.fp8 import cast_bytes

        extra += cast_bytes(w, tokens // (tp * cp))  # one converted layer's float8 casts (`plan.fp8`)
    gathered = layout.spec.gathered(w, layout, engine_gathered)
    step = Step(act, logits, checkpointing, copies=autocast_copies(w) if fp32_weights else Copies(),
                output_gradient=output_gradient_bytes(w, layout, fp32_weights),
                layer_gradient=layer_gradient_bytes(w, layout, fp32_weights), gathered=gathered.plus(extra),
                idle_at_loss=idle_at_loss(w, act, logit_tokens, checkpointing, tp if sequence_parallel else 1))
    peak = train_peak(step)
    return peak, reserved_peak(step) - peak.total, host


def measured_view(memory_gb: dict[str, float], measure: str) -> float:
    """The part of an estimate (GiB by component, as `MemoryEstimate.gb()`) that a measurement of kind
    `measure` counts: ``device`` (nvidia-smi) everything; ``reserved`` (torch.cuda.max_memory_reserved)
    without the CUDA context and NCCL buffers, which live outside torch's allocator; ``allocated``
    (max_memory_allocated) also without the allocator's cached, fragmented slack."""
    total = memory_gb.get("total", 0.0)
    if measure == "device":
        return total
    total -= memory_gb.get("runtime", 0.0)
    if measure == "reserved":
        return total
    if measure == "allocated":
        return total - memory_gb.get("allocator_reserve", 0.0)
    raise ValueError(f"unknown measure {measure!r} (device | reserved | allocated)")


def autocast_fp32_weights(w: Workload, layout: Layout) -> bool:
    """Whether the run trains fp32 weights under 16-bit autocast: full fine-tuning in mixed precision
    on one GPU or DDP (always for fp16). Sharding engines gather 16-bit weights themselves."""
    return (layout.spec.trainer_holds_weights and w.full_finetune and w.dtype != "fp32"
            and (w.dtype == "fp16" or w.fp32_master))


def autocast_weight_bytes(w: Workload) -> float:
    """16-bit copies of fp32 weights under autocast: each linear's weight is cast for its matmul, one
    copy per linear weight plus the output projection's. Recomputation does not shorten their life
    in forward: autocast caches the cast of every leaf parameter that needs a gradient until its
    region (the forward pass) ends, so at the end of the forward every copy is alive with or without
    activation checkpointing (torch's MemTracker shows the same; bench/plan_vs_tracker.py)."""
    return autocast_copies(w).every


def autocast_copies(w: Workload) -> Copies:
    """`autocast_weight_bytes`, the output layer's copy (kept by its matmul for backward) and one
    decoder layer's (cast again when a recomputed layer runs backward)."""
    m, c = w.model, w.compute_bytes
    head = c * m.output_width * m.hidden_size
    layer = c * sum(lin.count * lin.in_features * lin.out_features for lin in m.layer_linears())
    lin = widest_linear(m)
    return Copies(every=c * m.linear_params() + head, head=head, layer=layer,
                  widest=c * lin.count * lin.in_features * lin.out_features)


def output_gradient_bytes(w: Workload, layout: Layout, fp32_weights: bool) -> float:
    """The output layer's weight gradient as its backward makes it, where torch owns the gradients
    (one GPU, DDP): under autocast the matmul yields it in 16 bits and the cast to the fp32 weight's
    dtype copies it (that copy becomes the gradient, or is added to it); otherwise it is made in the
    weight's dtype. It comes after the logits' gradients are freed (`train_phase`), and is the same
    matrix when the head is tied to the embeddings. Sharding engines hold it in their own buffers
    (`fsdp_gathered`)."""
    if not _torch_owns_gradients(w, layout):
        return 0.0
    made, cast = _gradient_bytes(w, fp32_weights)
    return w.model.output_width * w.model.hidden_size * max(made, cast)


def layer_gradient_bytes(w: Workload, layout: Layout, fp32_weights: bool) -> LayerGradient:
    """A decoder layer's widest weight gradient: as its matmul's backward makes it, while the layer's
    activations are still alive; while autocast casts it to the fp32 weight's dtype (0 without
    autocast); and what stays of it for the rest of the layer's backward. Where torch owns the
    gradients (one GPU, DDP) it goes into `.grad` at once; FSDP2 keeps it unsharded, in the compute
    dtype, until the layer's reduce-scatter (`fsdp_gathered`). Other engines move it to their buckets."""
    lin = widest_linear(w.model)
    params = lin.count * lin.in_features * lin.out_features / layout.tensor_parallel
    if w.full_finetune and layout.spec.holds_layer_gradient(w):
        return LayerGradient(made=params * w.compute_bytes, held=params * w.compute_bytes)
    if not _torch_owns_gradients(w, layout):
        return LayerGradient()
    made, cast = _gradient_bytes(w, fp32_weights)
    return LayerGradient(made=params * made, cast=params * cast)


def _gradient_bytes(w: Workload, fp32_weights: bool) -> tuple[float, float]:
    """Bytes per weight of a gradient as backward makes it: the matmul's output (16 bits under
    autocast, else the weight's dtype), and under autocast that 16-bit gradient with its fp32 cast."""
    c = w.compute_bytes
    if fp32_weights:
        return c, c + 4
    return (4 if w.dtype == "fp32" else c), 0.0


def _torch_owns_gradients(w: Workload, layout: Layout) -> bool:
    return layout.spec.trainer_holds_weights and w.full_finetune and layout.offload == "none"


def _shards_weights(layout: Layout) -> bool:
    shards: bool = layout.spec.shards_weights(layout)
    return shards


def replica_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float, *,
                   gradient_buckets: bool = False, optimizer_shards: int = 1) -> float:
    """A full replica per process, trained by the Trainer in the weights' load dtype. Mixed precision
    (always for fp16, for bf16 with train.precision mixed) loads fp32 weights and computes under
    autocast, so gradients and AdamW states are fp32 too; pure bf16 keeps all three in bf16 (torch's
    AdamW and torchao's keep their states in the parameter's dtype). peft keeps adapters in fp32.
    `gradient_buckets`: DDP's buckets, a second copy of the gradients. `optimizer_shards`: ranks the
    optimizer states are partitioned over (ZeRO-1 without an engine). Returns host bytes (none)."""
    m, psi = w.model, w.model.total_params()
    mixed = autocast_fp32_weights(w, layout)
    wb = 4 if (w.dtype == "fp32" or not w.full_finetune or mixed) else w.compute_bytes
    ww, gg, oo = zero_model_states(trainable, optimizer_shards, 1 if optimizer_shards > 1 else 0,
                                   weight_bytes=wb, grad_bytes=wb,
                                   optimizer_bytes=optimizer_state_bytes(w.optimizer, wb, m.hidden_size))
    if w.full_finetune:
        frozen_bytes = (psi - trainable) * wb  # frozen weights load in the trained weights' dtype
    assign_trainable(w, part, ww, gg, oo, frozen_bytes)
    if foreach_temp(w.optimizer):
        part["optimizer_step"] = oo / 2
    if gradient_buckets:
        part["comm_buffers"] = gg
    return 0.0


def assign_trainable(w: Workload, part: dict[str, float], ww: float, gg: float, oo: float, frozen: float) -> None:
    """Book trainable weights, gradients and optimizer states (and the frozen weights) into `part`."""
    if w.full_finetune:  # `frozen`: parameters train.unfrozen_parameters leaves out
        part["weights"], part["gradients"], part["optimizer"] = ww + frozen, gg, oo
    else:
        part["weights"] = frozen
        part["adapter"] = ww + gg + oo
