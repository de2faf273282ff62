"""Bytes one training step holds for activations, logits and the generation KV cache.

Counted from the tensors autograd saves in transformers' implementations (docs/planner.md,
"Activations"); `memory.estimate` adds them to the model states of a layout.
"""

from __future__ import annotations

import math

from recipeforge.plan.workload import Workload


def layer_activation_bytes_per_token(w: Workload) -> float:
    """Bytes one decoder layer keeps for backward per token (no recomputation), following the
    tensors autograd saves in transformers' implementations (Korthikanti et al. 2022 count the same
    way for GPT: 34*h bytes per token with fused attention)."""
    return sum(layer_activation_parts(w).values())


def layer_activation_parts(w: Workload) -> dict[str, float]:
    """`layer_activation_bytes_per_token` by part: ``norms`` (hidden-sized, whole on every
    tensor-parallel rank unless sequence parallelism splits them), ``attention`` and ``mlp`` (split
    over the heads / MLP columns by tensor parallelism), ``lora`` (adapter inputs, hidden-sized)."""
    m, c = w.model, w.compute_bytes
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    full = w.full_finetune
    # RMSNorm upcasts its input to fp32 and keeps it; with a trainable weight it also keeps the
    # normalised 16-bit tensor. Its output is the next linears' input.
    if w.fused_kernels:
        norm = c * h + (c * h if full else 0)
    else:
        norm = 4 * h + (2 * c * h if full else 0)
    # Attention: q, k, v after RoPE, the output and its contiguous copy for o_proj; the fused kernels
    # keep an fp32 log-sum-exp per head. Eager attention keeps the fp32 softmax and its 16-bit copy.
    attn = c * (q + 2 * kv) + 2 * c * q + 4 * m.num_heads
    if w.attention == "eager":
        attn += (4 + c) * m.num_heads * w.seq_len + c * 2 * (q - kv)  # scores, and k/v repeated to all heads
    if not full:
        attn -= c * q  # a frozen o_proj does not keep its input
    # MLP: gated (SwiGLU) keeps gate, act(gate), up and their product; classic keeps fc1 out and act out.
    width = m.mlp_width
    if m.gated_mlp:
        mlp = c * width * (3 if w.fused_kernels else 4) - (0 if full else c * width)
    else:
        mlp = 2 * c * width
    if m.is_moe:
        # routed tokens are copied once per chosen expert, router logits kept in fp32
        mlp += c * h * m.experts_per_token + 4 * m.num_experts
    lora = 0.0
    if not full:
        # peft casts the input to the fp32 adapter, dropout keeps a mask, autocast keeps a 16-bit copy
        # for lora_A, and lora_B keeps the r-wide intermediate.
        for lin in w.lora_linears:
            per_in = c + (1 if w.lora_dropout > 0 else 0)
            lora += lin.count * (per_in * lin.in_features + c * w.lora_rank)
    return {"norms": 2 * norm, "attention": attn, "mlp": mlp, "lora": lora}


def activation_bytes(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                     context_parallel: int = 1, sequence_parallel: bool = True) -> float:
    """Activations kept for backward for `tokens` tokens (one micro batch) over `layers` layers on one
    GPU. With recomputation (per decoder layer, as transformers and Megatron's full recompute do) each
    layer keeps only its input, and one layer at a time is recomputed in full.

    Context parallelism gives each GPU 1/`context_parallel` of every sequence (all of its tensors).
    Tensor parallelism splits the attention heads and MLP columns; with `sequence_parallel`
    (Megatron) it splits the hidden-sized tensors between them too, without it (transformers'
    tensor-parallel plans) norms, layer inputs and the lm_head input stay whole on every rank."""
    m, c = w.model, w.compute_bytes
    t = tensor_parallel
    parts = layer_activation_parts(w)
    split = parts["attention"] + parts["mlp"]
    whole = parts["norms"] + parts["lora"]
    per_layer = (split + whole) / t if sequence_parallel else split / t + whole
    layer_input = c * m.hidden_size / (t if sequence_parallel else 1)
    outside = (4 * m.hidden_size + 2 * c * m.hidden_size) / (t if sequence_parallel else 1)  # final norm, lm_head input
    local = tokens / context_parallel
    if checkpointing:
        stored = local * (layers * layer_input + per_layer)
    else:
        stored = local * layers * per_layer
    return stored + local * outside


def activation_terms(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                     context_parallel: int = 1, sequence_parallel: bool = True) -> str:
    """The terms `activation_bytes` adds up, for the plan's reasons: bytes per token and layer by part,
    how attention scales with the sequence, and what tensor / context parallelism divide."""
    m, c = w.model, w.compute_bytes
    parts = layer_activation_parts(w)
    seq = w.seq_len
    if w.attention == "eager":
        scaling = (f"eager attention keeps the {seq}x{seq} scores per head: "
                   f"{(4 + c) * m.num_heads * seq / 1024:.0f} KiB per token and layer, O(s^2) per sequence")
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
    if checkpointing:
        out.append(f"recomputation keeps {c * m.hidden_size} B per token per layer input over {layers} layers "
                   "plus one layer in full")
    return "; ".join(out)


def logits_bytes(w: Workload, tokens: int, tensor_parallel: int = 1) -> float:
    """Logits of `tokens` tokens at their peak. transformers' causal-LM loss upcasts the 16-bit logits
    to fp32 and keeps the fp32 log-softmax for backward: c + 8 bytes per vocabulary entry in forward.
    Backward then holds the saved log-softmax, the gradient nll_loss hands it and the gradient it
    returns, all fp32: 12 bytes, the larger of the two for 16-bit compute. Liger's fused linear
    cross-entropy only ever holds one chunk of rows."""
    m, c = w.model, w.compute_bytes
    if m.num_labels:
        # A sequence-classification head scores every token (num_labels values in the compute dtype)
        # and the loss reads one score per sequence: no vocabulary-wide logits.
        return tokens * c * m.num_labels
    per_token = max(c + 8, 12) * m.vocab_size / tensor_parallel
    if w.fused_loss:
        chunk = 2 ** math.ceil(math.log2(max(1, math.ceil(tokens / math.ceil(m.vocab_size / m.hidden_size)))))
        return min(tokens, chunk) * per_token
    return tokens * per_token


def kv_cache_bytes(w: Workload, sequences: int) -> float:
    """K and V of every layer for `sequences` prompt+completion sequences (transformers' generate)."""
    r, m = w.rollout, w.model
    return sequences * (r.prompt_len + r.completion_len) * m.num_layers * 2 * m.kv_dim * w.compute_bytes
