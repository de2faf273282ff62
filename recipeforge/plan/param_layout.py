"""The parameter names and sizes transformers builds for a `ModelSpec`, without building the model.

`parameter_layout(spec)` lists ``(name, numel)`` for every parameter as ``model.named_parameters()``
reports it (tied weights once), so `train.unfrozen_parameters` patterns can be matched and their
trainable count planned before any weight is loaded. A test compares the list with the model
transformers builds, architecture by architecture; its sum equals `ModelSpec.total_params()`.
"""

from __future__ import annotations

from recipeforge.plan.linear import Linear
from recipeforge.plan.models import _CLASSIC, _FOUR_NORMS, _QK_NORM, ModelSpec


# Where transformers puts the language model of a vision-language model (Qwen-VL, LLaVA, Gemma 3,
# Mllama alike): its decoder under this prefix, the output layer at the top as in a text model.
VISION_LANGUAGE_PREFIX = "model.language_model."


def parameter_layout(spec: ModelSpec) -> list[tuple[str, int]]:
    """``(name, numel)`` of every parameter of `spec`, in module order. For a vision-language model,
    those of its language model (named as in the whole model); the vision tower's and projector's are
    not listed."""
    if spec.model_type == "gpt2":
        return _gpt2(spec)
    if spec.vision is not None:
        return [(VISION_LANGUAGE_PREFIX + n.removeprefix("model.") if n.startswith("model.") else n, size)
                for n, size in _decoder(spec)]
    return _decoder(spec)


def _decoder(spec: ModelSpec) -> list[tuple[str, int]]:
    """The layout of a decoder-only language model (Llama-style names)."""
    h = spec.hidden_size
    out = [("model.embed_tokens.weight", spec.vocab_size * h)]
    dense = set(spec.dense_layers) if spec.is_moe else set(range(spec.num_layers))
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        out += _attention(spec, p + "self_attn.")
        out += _dense_mlp(spec, p + "mlp.") if i in dense else _moe_mlp(spec, p + "mlp.")
        out += _layer_norms(spec, p)
    final = "model.final_layernorm" if spec.model_type == "phi" else "model.norm"
    out += _norm(spec, final, h)
    if not spec.tie_embeddings:
        out.append(("lm_head.weight", spec.vocab_size * h))
        if spec.model_type == "phi":
            out.append(("lm_head.bias", spec.vocab_size))
    return out


def _linear(prefix: str, lin: Linear) -> list[tuple[str, int]]:
    out = [(f"{prefix}{lin.name}.weight", lin.in_features * lin.out_features)]
    if lin.bias:
        out.append((f"{prefix}{lin.name}.bias", lin.out_features))
    return out


def _norm(spec: ModelSpec, name: str, width: int) -> list[tuple[str, int]]:
    """An RMSNorm (weight) or, in the GPT-2 / Phi-2 / StarCoder2 family, a LayerNorm (weight and bias)."""
    out = [(f"{name}.weight", width)]
    if spec.model_type in _CLASSIC:
        out.append((f"{name}.bias", width))
    return out


def _attention(spec: ModelSpec, p: str) -> list[tuple[str, int]]:
    linears = spec.attention_linears()
    if spec.model_type == "phi":  # Phi-2 calls its output projection `dense`
        linears = [Linear("dense", lin.in_features, lin.out_features, bias=lin.bias) if lin.name == "o_proj" else lin
                   for lin in linears]
    if spec.model_type == "phi3":  # one fused q/k/v projection
        q, k, v, o = linears
        linears = [Linear("qkv_proj", q.in_features, q.out_features + k.out_features + v.out_features), o]
    out: list[tuple[str, int]] = []
    for lin in linears:
        out += _linear(p, lin)
        if lin.name == "q_a_proj":
            out.append((p + "q_a_layernorm.weight", spec.q_lora_rank))
        elif lin.name == "kv_a_proj_with_mqa":
            out.append((p + "kv_a_layernorm.weight", spec.kv_lora_rank))
    if spec.model_type in _QK_NORM:
        out += [(p + "q_norm.weight", spec.head_dim), (p + "k_norm.weight", spec.head_dim)]
    elif spec.model_type == "olmo2":
        out += [(p + "q_norm.weight", spec.q_dim), (p + "k_norm.weight", spec.kv_dim)]
    if spec.model_type == "gpt_oss":
        out.append((p + "sinks", spec.num_heads))
    return out


def _dense_mlp(spec: ModelSpec, p: str) -> list[tuple[str, int]]:
    linears = spec.dense_mlp_linears()
    if spec.model_type == "phi3":  # gate and up fused
        gate, up, down = linears
        linears = [Linear("gate_up_proj", gate.in_features, gate.out_features + up.out_features), down]
    elif spec.model_type in ("phi", "starcoder2"):
        names = ("fc1", "fc2") if spec.model_type == "phi" else ("c_fc", "c_proj")
        linears = [Linear(n, lin.in_features, lin.out_features, bias=lin.bias) for n, lin in zip(names, linears)]
    return [entry for lin in linears for entry in _linear(p, lin)]


def _moe_mlp(spec: ModelSpec, p: str) -> list[tuple[str, int]]:
    """Router, the routed experts as transformers 5 stores them (one fused 3-D gate/up tensor and
    one down tensor per layer, gpt-oss with biases), and the shared experts."""
    out: list[tuple[str, int]] = []
    e, h, i = spec.num_experts, spec.hidden_size, spec.moe_intermediate_size
    for lin in spec.mlp_linears():
        if lin.name.startswith("experts."):
            continue
        out += _linear(p, lin)
    out.append((p + "experts.gate_up_proj", e * 2 * i * h))
    out.append((p + "experts.down_proj", e * i * h))
    if spec.model_type == "gpt_oss":
        out += [(p + "experts.gate_up_proj_bias", e * 2 * i), (p + "experts.down_proj_bias", e * h)]
    return out


def _layer_norms(spec: ModelSpec, p: str) -> list[tuple[str, int]]:
    h = spec.hidden_size
    if spec.model_type == "phi":  # one norm before the parallel attention and MLP
        names = ["input_layernorm"]
    elif spec.model_type == "olmo2":  # normalises after each sub-block only
        names = ["post_attention_layernorm", "post_feedforward_layernorm"]
    else:
        names = ["input_layernorm", "post_attention_layernorm"]
        if spec.model_type in _FOUR_NORMS:
            names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    return [entry for n in names for entry in _norm(spec, p + n, h)]


def _gpt2(spec: ModelSpec) -> list[tuple[str, int]]:
    h, i = spec.hidden_size, spec.intermediate_size
    out = [("transformer.wte.weight", spec.vocab_size * h), ("transformer.wpe.weight", spec.max_position_embeddings * h)]
    for n in range(spec.num_layers):
        p = f"transformer.h.{n}."
        out += [(p + "ln_1.weight", h), (p + "ln_1.bias", h),
                (p + "attn.c_attn.weight", h * 3 * h), (p + "attn.c_attn.bias", 3 * h),
                (p + "attn.c_proj.weight", h * h), (p + "attn.c_proj.bias", h),
                (p + "ln_2.weight", h), (p + "ln_2.bias", h),
                (p + "mlp.c_fc.weight", h * i), (p + "mlp.c_fc.bias", i),
                (p + "mlp.c_proj.weight", i * h), (p + "mlp.c_proj.bias", h)]
    out += [("transformer.ln_f.weight", h), ("transformer.ln_f.bias", h)]
    if not spec.tie_embeddings:
        out.append(("lm_head.weight", spec.vocab_size * h))
    return out
