"""Bytes one training step holds for activations, logits and the generation KV cache.

Counted from the tensors autograd saves in transformers' implementations (docs/planner.md,
"Activations"); `memory.estimate` adds them to the model states of a layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recipeforge.plan.linear import Linear
from recipeforge.plan.models import ModelSpec
from recipeforge.plan.workload import Workload


def layer_activation_bytes_per_token(w: Workload, *, fp32_weights: bool = False) -> float:
    """Bytes one decoder layer keeps for backward per token (no recomputation), following the
    tensors autograd saves in transformers' implementations (Korthikanti et al. 2022 count the same
    way for GPT: 34*h bytes per token with fused attention)."""
    return sum(layer_activation_parts(w, fp32_weights=fp32_weights).values())


def layer_activation_parts(w: Workload, *, fp32_weights: bool = False) -> dict[str, float]:
    """`layer_activation_bytes_per_token` by part: ``norms`` (hidden-sized, whole on every
    tensor-parallel rank unless sequence parallelism splits them), ``attention`` and ``mlp`` (split
    over the heads / MLP columns by tensor parallelism), ``lora`` (adapter inputs, hidden-sized).

    `fp32_weights`: full fine-tuning of fp32 weights under 16-bit autocast (the Trainer's mixed
    precision on one GPU or DDP), where the residual stream stays fp32."""
    m, c = w.model, w.compute_bytes
    width = m.mlp_width
    if m.gated_mlp:
        # the down projection's input is kept for its weight gradient only when it trains
        mlp = c * width * (3 if w.fused_kernels else 4) - (0 if w.linears_train else c * width)
    else:
        mlp = 2 * c * width  # classic MLP: fc1 out and act out
    if m.is_moe:
        # routed tokens are copied once per chosen expert, router logits kept in fp32
        mlp += c * m.hidden_size * m.experts_per_token + 4 * m.num_experts
    return {"norms": _norm_bytes(w, fp32_weights), "attention": _attention_bytes(w), "mlp": mlp,
            "lora": _lora_input_bytes(w)}


def _norm_bytes(w: Workload, fp32_weights: bool) -> float:
    """The two RMSNorms of a layer. Each upcasts its input to fp32 and keeps it; a trainable weight
    also keeps the normalised tensor (in the input's dtype) and the next linears keep the output."""
    m, c, h = w.model, w.compute_bytes, w.model.hidden_size
    if w.fused_kernels:
        return 2 * (c * h + (c * h if w.linears_train else 0))
    if not (w.norms_train and w.linears_train):
        # a frozen norm weight keeps no normalised tensor, frozen linears keep no copy of the output
        return 2 * (4 * h + (c * h if w.norms_train else 0) + (c * h if w.linears_train else 0))
    if fp32_weights:
        # The residual stream is fp32 (fp32 embeddings, fp32 sums): the normalised tensor and the
        # output stay fp32, and autocast casts the output once for every linear that reads it, each
        # keeping its own 16-bit copy (q, k and v; gate and up).
        return 2 * (4 * h + 4 * h) + c * h * norm_readers(m)
    return 2 * (4 * h + 2 * c * h)


def norm_readers(m: ModelSpec) -> int:
    """Linears of a layer that read a norm's output (q, k, v / the latent projections; gate and up,
    the router, shared experts; a token's routed experts each read their own copy)."""
    own_input = ("o_proj", "q_b_proj", "kv_b_proj")
    count = sum(1 for lin in m.layer_linears()
                if not lin.name.startswith("experts.") and lin.name.rsplit(".", 1)[-1] not in own_input
                and not lin.name.endswith("down_proj"))
    return count + (m.experts_per_token if m.is_moe else 0)


def _attention_bytes(w: Workload) -> float:
    """q, k and v after RoPE, the attention output, and what the kernel keeps besides.

    Fused kernels (sdpa, flash) keep their output (which o_proj reads without a copy: the kernels
    write it in the (batch, sequence, heads) layout) and an fp32 log-sum-exp per head. sdpa given a
    dense mask (packed rows: transformers builds the block-diagonal mask from the position ids) cannot
    share key/value heads (GQA), so k and v are repeated to every query head, and it converts the
    boolean mask to an additive one in the compute dtype in every layer and keeps it for backward.
    Eager attention keeps the fp32 softmax and its 16-bit copy, k and v repeated to all heads, and
    the transposed copy of its output that only a trainable o_proj keeps."""
    m, c = w.model, w.compute_bytes
    q, kv = m.q_dim, m.kv_dim
    attn = c * (q + 2 * kv)
    if w.attention == "eager":
        attn += (4 + c) * m.num_heads * w.seq_len + c * 2 * (q - kv) + (c * q if w.linears_train else 0)
        return attn
    attn += c * q + 4 * m.num_heads
    if w.attention_mask:
        attn += c * 2 * (q - kv) + c * w.seq_len
    return attn


def _lora_input_bytes(w: Workload) -> float:
    """peft casts each adapted linear's input to the fp32 adapter, dropout keeps a mask, autocast
    keeps a 16-bit copy for lora_A (one per linear, even where linears share their input), and
    lora_B keeps the r-wide intermediate."""
    if w.full_finetune:
        return 0.0
    per_in = w.compute_bytes + (1 if w.lora_dropout > 0 else 0)
    return sum(lin.count * (per_in * lin.in_features + w.compute_bytes * w.lora_rank) for lin in w.lora_linears)


# An RMSNorm's backward runs on fp32 h-wide tensors, several at once: the incoming gradient cast to
# fp32, its product with the weight, that times rsqrt (the input's gradient path), that times the
# input (for rsqrt's gradient), the mean's gradient broadcast back, and pow's 2x times it.
_NORM_BACKWARD_FP32 = 6


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro batch on one GPU, by when they are alive.

    ``stored``: kept from their layer's forward to its backward (every layer's saved tensors, or
    with recomputation every layer's input); ``recomputed``: the one layer recomputed in full during
    backward; ``layer``: one layer's saved tensors without recomputation (freed by its backward);
    ``outside``: the final norm and the output layer's input, freed once the loss's backward has
    passed them; ``norm_backward``: the fp32 temporaries of an RMSNorm's backward at the end of a
    layer's backward; ``incoming``: the gradient reaching a layer in backward; ``working``: the
    input gradients the widest linear's backward makes next to the layer's saved tensors
    (`layer_working_bytes`); ``mlp_backward``: what the MLP's elementwise backward holds besides
    them (`mlp_backward_bytes`)."""

    stored: float
    recomputed: float
    layer: float
    outside: float
    norm_backward: float
    incoming: float = 0.0
    working: float = 0.0
    mlp_backward: float = 0.0

    @property
    def total(self) -> float:
        """Everything at once: what the forward pass leaves for backward."""
        return self.stored + self.recomputed + self.outside


def activation_split(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                     context_parallel: int = 1, sequence_parallel: bool = True,
                     fp32_weights: bool = False) -> Activations:
    """`Activations` of `tokens` tokens (one micro batch) over `layers` layers on one GPU. With
    recomputation (per decoder layer, as transformers and Megatron's full recompute do) each layer
    keeps only its input, and one layer at a time is recomputed in full.

    Context parallelism gives each GPU 1/`context_parallel` of every sequence (all of its tensors).
    Tensor parallelism splits the attention heads and MLP columns; with `sequence_parallel`
    (Megatron) it splits the hidden-sized tensors between them too, without it (transformers'
    tensor-parallel plans) norms, layer inputs and the lm_head input stay whole on every rank.
    `fp32_weights`: fp32 weights under 16-bit autocast (`layer_activation_parts`)."""
    c, h = w.compute_bytes, w.model.hidden_size
    t = tensor_parallel
    whole_div = t if sequence_parallel else 1
    parts = layer_activation_parts(w, fp32_weights=fp32_weights)
    split = parts["attention"] + parts["mlp"]
    whole = parts["norms"] + parts["lora"]
    per_layer = (split + whole) / t if sequence_parallel else split / t + whole
    # the residual stream between layers: fp32 when fp32 weights run under autocast
    layer_input = (4 if fp32_weights else c) * h / whole_div
    local = tokens / context_parallel
    recomputed = per_layer
    if checkpointing and w.checkpoint_mode == "selective":
        # each layer keeps its input and what the policy saves; the backward recomputes the rest of one layer
        saved = selective_saved_bytes(w) / (t if sequence_parallel else 1)
        mask = w.seq_len if w.attention_mask else 0
        stored = local * (layers * (layer_input + saved) + mask)
        recomputed = max(0.0, per_layer - saved)
    elif checkpointing:
        # checkpointed layers also take the boolean block-diagonal mask as an input: one per sequence;
        # with checkpoint_every N, the layers in between keep all their activations
        mask = w.seq_len if w.attention_mask else 0
        checkpointed = -(-layers // max(1, w.checkpoint_every))
        stored = local * (checkpointed * layer_input + (layers - checkpointed) * per_layer + mask)
    else:
        stored = local * layers * per_layer
    return Activations(stored=stored, recomputed=local * recomputed if checkpointing else 0.0,
                       layer=0.0 if checkpointing else local * per_layer,
                       outside=local * _outside_bytes(w, fp32_weights) / whole_div,
                       norm_backward=0.0 if w.fused_kernels else local * _NORM_BACKWARD_FP32 * 4 * h / whole_div,
                       incoming=local * (4 if fp32_weights else c) * h / whole_div,
                       working=local * layer_working_bytes(w, tensor_parallel),
                       mlp_backward=local * mlp_backward_bytes(w, tensor_parallel))


def selective_saved_bytes(w: Workload) -> float:
    """Per token and layer, what selective checkpointing keeps besides the layer's input
    (`stages.checkpointing`: torchtitan's policy): the outputs of every second matrix multiply in call
    order (the layer's linears, and with LoRA each adapted linear's lora_A and lora_B right after its
    base), and the attention kernel's output with its fp32 log-sum-exp per head. The MLP of an MoE
    layer runs its experts as batched matmuls, counted once per routed copy."""
    m, c = w.model, w.compute_bytes
    adapted = {lin.name for lin in w.lora_linears}
    outputs: list[float] = []
    for lin in m.layer_linears():
        copies = m.experts_per_token if lin.name.startswith("experts.") else 1
        outputs.append(c * lin.out_features * copies)
        if lin.name in adapted:
            outputs += [c * w.lora_rank, c * lin.out_features]
    matmuls = sum(out for i, out in enumerate(outputs) if i % 2 == 0)
    attention = c * m.q_dim + 4 * m.num_heads
    return matmuls + attention


def layer_working_bytes(w: Workload, tensor_parallel: int = 1) -> float:
    """Per token, the input gradients the backward of a layer's widest linear makes while the layer's
    saved tensors are still alive (a recomputed layer's forward holds about as much just before). A
    trainable linear's input gradient is c bytes per input feature. peft runs its fp32 adapters on an
    fp32 copy of the input (as `_lora_input_bytes` counts them), so an adapted linear's input gradient
    also passes through fp32 (4 bytes) and back (c), next to the frozen base's (c); with dropout that
    fp32 gradient is masked once more (4)."""
    m, c = w.model, w.compute_bytes
    if w.full_finetune:
        return c * widest_linear(m).in_features / tensor_parallel
    widest = max((lin.in_features for lin in w.lora_linears), default=0)
    adapter = (4 + c + (4 if w.lora_dropout > 0 else 0)) * widest
    return (c * m.mlp_width + adapter) / tensor_parallel


def mlp_backward_bytes(w: Workload, tensor_parallel: int = 1) -> float:
    """Per token, what the MLP's elementwise backward holds besides the layer's saved tensors, once
    the down projection's backward has run (its saved input freed, its input gradient alive): a
    gated MLP's product makes the gradients of both its factors at once (2c·I over the saved set),
    a classic one's activation the gradient of its input (c·I). With a frozen base (LoRA) the
    adapters' gradient paths are larger (`layer_working_bytes`)."""
    if not w.full_finetune:
        return 0.0
    return (2 if w.model.gated_mlp else 1) * w.compute_bytes * w.model.mlp_width / tensor_parallel


def widest_linear(m: ModelSpec) -> Linear:
    """The linear of a layer with the most weights (routed experts count together: transformers 5
    stores them as one fused tensor)."""
    return max(m.layer_linears(), key=lambda lin: lin.count * lin.in_features * lin.out_features)


def _outside_bytes(w: Workload, fp32_weights: bool) -> float:
    """Per token outside the layers: the final norm's fp32 input, and with a trainable norm and
    output layer the normalised tensor and the output layer's input (a cast of the fp32 output with
    fp32 weights under autocast)."""
    c, h = w.compute_bytes, w.model.hidden_size
    if not (w.norms_train and w.linears_train):
        return 4 * h + (c * h if w.norms_train else 0) + (c * h if w.linears_train else 0)
    if fp32_weights:
        return 4 * h + 4 * h + c * h
    return 4 * h + 2 * c * h


def activation_bytes(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                     context_parallel: int = 1, sequence_parallel: bool = True, fp32_weights: bool = False) -> float:
    """Activations the forward pass leaves for backward (`activation_split`, everything at once)."""
    return activation_split(w, tokens, layers=layers, checkpointing=checkpointing, tensor_parallel=tensor_parallel,
                            context_parallel=context_parallel, sequence_parallel=sequence_parallel,
                            fp32_weights=fp32_weights).total


def activation_terms(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                     context_parallel: int = 1, sequence_parallel: bool = True, fp32_weights: bool = False) -> str:
    """The terms `activation_bytes` adds up, for the plan's reasons: bytes per token and layer by part,
    how attention scales with the sequence, and what tensor / context parallelism divide."""
    m, c = w.model, w.compute_bytes
    parts = layer_activation_parts(w, fp32_weights=fp32_weights)
    seq = w.seq_len
    if w.attention == "eager":
        scaling = (f"eager attention keeps the {seq}x{seq} scores per head: "
                   f"{(4 + c) * m.num_heads * seq / 1024:.0f} KiB per token and layer, O(s^2) per sequence")
    elif w.attention_mask:
        scaling = (f"sdpa over packed rows keeps a {seq}x{seq} mask per layer ({c * seq / 1024:.0f} KiB per token "
                   "and layer) and k/v repeated to every head")
    else:
        scaling = "fused attention (sdpa/flash) keeps no score matrix: O(s) per sequence"
    local = tokens // max(1, context_parallel)
    kib = {k: v / 1024 for k, v in parts.items()}
    out = [f"per token and layer {sum(kib.values()):.1f} KiB (norms {kib['norms']:.1f}, attention "
           f"{kib['attention']:.1f}, MLP {kib['mlp']:.1f}" + (f", LoRA {kib['lora']:.1f}" if parts["lora"] else "")
           + f"); {scaling}",
           f"{local} tokens per GPU (micro batch x {seq}" + (f" / context parallel {context_parallel}"
                                                              if context_parallel > 1 else "") + ")"]
    if tensor_parallel > 1:
        out.append(f"tensor parallel {tensor_parallel} divides " + (
            "every tensor (sequence parallel)" if sequence_parallel else
            "attention and MLP; norms and layer inputs stay whole on each rank"))
    if checkpointing and w.checkpoint_mode == "selective":
        out.append(f"selective recomputation keeps {(4 if fp32_weights else c) * m.hidden_size} B per token of layer "
                   f"input and {selective_saved_bytes(w) / 1024:.1f} KiB of matmul and attention outputs per layer "
                   f"over {layers} layers, and recomputes the rest of one layer while it runs backward")
    elif checkpointing and w.checkpoint_every > 1:
        out.append(f"recomputation of every {w.checkpoint_every}th layer ({-(-layers // w.checkpoint_every)} of "
                   f"{layers}) keeps their inputs; the others keep all their activations")
    elif checkpointing:
        out.append(f"recomputation keeps {(4 if fp32_weights else c) * m.hidden_size} B per token per layer input "
                   f"over {layers} layers plus one layer in full while it runs backward")
    return "; ".join(out)


def logits_bytes(w: Workload, tokens: int, tensor_parallel: int = 1) -> float:
    """Logits of `tokens` tokens at their peak, the larger of `logits_phases`."""
    return max(logits_phases(w, tokens, tensor_parallel))


def logits_phases(w: Workload, tokens: int, tensor_parallel: int = 1) -> tuple[float, float]:
    """(forward, backward) bytes of the logits and the loss of `tokens` tokens. transformers'
    causal-LM loss upcasts 16-bit logits to fp32 and keeps the fp32 log-softmax for backward: c + 8
    bytes per vocabulary entry while the loss is computed (8 for fp32 logits, which are not copied).
    Backward then holds the saved log-softmax, the gradient nll_loss hands it and the gradient it
    returns, all fp32: 12 bytes. (The model's 16-bit logits are gone by then: the Trainer keeps only
    the loss.) Liger's fused linear cross-entropy only ever holds one chunk of rows."""
    m, c = w.model, w.compute_bytes
    if m.num_labels:
        # A sequence-classification head scores every token (num_labels values in the compute dtype)
        # and the loss reads one score per sequence: no vocabulary-wide logits.
        return tokens * c * m.num_labels, tokens * c * m.num_labels
    vocab = m.vocab_size / tensor_parallel
    forward, backward = (c + 8 if c < 4 else 8) * vocab, 12 * vocab
    if w.fused_loss:
        chunk = 2 ** math.ceil(math.log2(max(1, math.ceil(tokens / math.ceil(m.vocab_size / m.hidden_size)))))
        rows = min(tokens, chunk)
        return rows * backward, rows * backward
    return tokens * forward, tokens * backward


def upcast_logits_bytes(w: Workload, tokens: int, tensor_parallel: int = 1) -> float:
    """The 16-bit logits of `tokens` tokens that the loss upcasts to fp32 and then frees (0 where no
    vocabulary-wide 16-bit logits are made: fp32 compute, a fused loss, a classification head)."""
    m, c = w.model, w.compute_bytes
    if m.num_labels or w.fused_loss or c >= 4:
        return 0.0
    return tokens * c * m.vocab_size / tensor_parallel


def idle_at_loss(w: Workload, act: Activations, logit_tokens: int, checkpointing: bool,
                 tensor_parallel: int = 1) -> tuple[float, float]:
    """Bytes the caching allocator holds in free blocks too small for the loss's requests, at the end
    of the forward pass and in the loss's backward (`train_phase.Moment.idle`). The blocks the
    layers' working tensors leave (with recomputation: one layer's forward, freed as each checkpointed
    layer returns; without: one layer's backward of the previous step) are each far smaller than a
    vocabulary-wide tensor, and so is the 16-bit logits block the upcast frees before the loss's
    backward asks for its 4-byte gradients. Checked against a replay of the caching allocator's rules
    on traces of real steps (bench/allocator_replay.py)."""
    working = act.recomputed if checkpointing else act.working + act.mlp_backward
    return working, working + upcast_logits_bytes(w, logit_tokens, tensor_parallel)


def kv_cache_bytes(w: Workload, sequences: int) -> float:
    """K and V of every layer for `sequences` prompt+completion sequences (transformers' generate)."""
    r, m = w.rollout, w.model
    assert r is not None  # called for a workload that generates (GRPO)
    return sequences * (r.prompt_len + r.completion_len) * m.num_layers * 2 * m.kv_dim * w.compute_bytes
