"""Decoder-only architectures as numbers: parameter counts without weights.

A `ModelSpec` is read from a Hugging Face ``config.json`` dict (`spec_from_config`). Counts are exact
sums over the modules transformers builds for that architecture (Llama, Mistral, Mixtral, Qwen2/3
and their MoE variants, DeepSeek-V3, gpt-oss, Gemma 1/2/3, Phi-2/3, GPT-2), so they match the
published sizes. MoE models report the total and the active (per-token) count: a token passes the
router, its top-k routed experts and the shared experts; layers kept dense (DeepSeek's first k,
Qwen's `decoder_sparse_step` / `mlp_only_layers`) count their dense MLP in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipeforge.plan.linear import Linear
from recipeforge.plan.vision import VisionSpec, vision_from_config

# model_type -> decoder layer class (FSDP wraps these; they are also transformers' _no_split_modules).
DECODER_LAYER_CLASS = {
    "llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer", "qwen2_moe": "Qwen2MoeDecoderLayer", "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer", "gemma": "GemmaDecoderLayer", "gemma2": "Gemma2DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer", "phi3": "Phi3DecoderLayer", "phi": "PhiDecoderLayer",
    "gpt2": "GPT2Block", "olmo2": "Olmo2DecoderLayer", "starcoder2": "Starcoder2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer", "gpt_oss": "GptOssDecoderLayer",
    # the language models of vision-language models (their own decoder layer classes)
    # (`_model_type` names a Qwen-VL text_config by its model's type)
    "qwen2_vl": "Qwen2VLDecoderLayer", "qwen2_5_vl": "Qwen2_5_VLDecoderLayer", "qwen3_vl": "Qwen3VLTextDecoderLayer",
    "mllama_text_model": "MllamaSelfAttentionDecoderLayer",
}
# Architectures whose attention projections carry biases (q, k, v; not o).
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# Architectures with a per-head RMSNorm on queries and keys.
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text", "qwen3_vl"}
# Gemma 2/3 normalise before and after both sub-blocks: four norms per layer.
_FOUR_NORMS = {"gemma2", "gemma3_text"}
# Non-gated MLPs with biases and LayerNorm (weight + bias).
_CLASSIC = {"gpt2", "phi", "starcoder2"}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int                         # MLA: the query/key head width (nope + rope parts)
    tie_embeddings: bool
    num_experts: int = 0                  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # all shared experts of a layer together
    shared_expert_gate: bool = False      # Qwen2-MoE gates its shared expert with a 1-wide linear
    dense_layers: tuple[int, ...] = ()    # indices of an MoE model's layers that keep a dense MLP
    attention_bias: bool = False          # biases on q, k, v and o (config `attention_bias`)
    mlp_bias: bool = False                # biases on a gated dense MLP (Llama's `mlp_bias`)
    q_lora_rank: int = 0                  # DeepSeek MLA: low-rank query projection (0: a full q_proj)
    kv_lora_rank: int = 0                 # DeepSeek MLA: compressed key/value width (0: not MLA)
    qk_rope_head_dim: int = 0             # DeepSeek MLA: the rotary part of each query/key head
    v_head_dim: int = 0                   # DeepSeek MLA: value head width
    max_position_embeddings: int = 0      # only GPT-2 stores positions as parameters
    num_labels: int = 0                   # a sequence-classification head's outputs (0: the LM head)
    vision: VisionSpec | None = None      # a vision-language model's image side (`plan.vision`)
    name: str = ""
    notes: tuple[str, ...] = field(default=())

    # ------------------------------------------------------------------ shape helpers
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Decoder layers with routed experts (0 for dense models)."""
        return self.num_layers - len(self.dense_layers) if self.is_moe else 0

    @property
    def dense_layer_count(self) -> int:
        """Decoder layers with a dense MLP."""
        return self.num_layers - self.moe_layers

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def decoder_layer_class(self) -> str:
        return DECODER_LAYER_CLASS.get(self.model_type, "LlamaDecoderLayer")

    @property
    def mlp_width(self) -> int:
        """Hidden width of the MLP one token actually passes through (its top-k experts plus the
        shared ones), averaged over the layers when some of them stay dense."""
        if not self.is_moe:
            return self.intermediate_size
        moe = self.experts_per_token * self.moe_intermediate_size + self.shared_expert_intermediate_size
        return round((self.moe_layers * moe + self.dense_layer_count * self.intermediate_size) / self.num_layers)

    @property
    def gated_mlp(self) -> bool:
        return self.model_type not in _CLASSIC

    @property
    def router_name(self) -> str:
        return "router" if self.model_type == "gpt_oss" else "gate"

    @property
    def shared_expert_name(self) -> str:
        return "shared_experts" if self.model_type == "deepseek_v3" else "shared_expert"

    # ------------------------------------------------------------------ linears
    def attention_linears(self) -> list[Linear]:
        h = self.hidden_size
        if self.is_mla:
            # DeepSeek's multi-head latent attention: queries (optionally through a low rank), keys and
            # values through one compressed latent plus a shared rotary key part.
            n, qk, b, rope = self.num_heads, self.head_dim, self.attention_bias, self.qk_rope_head_dim
            q = ([Linear("q_a_proj", h, self.q_lora_rank, bias=b), Linear("q_b_proj", self.q_lora_rank, n * qk)]
                 if self.q_lora_rank else [Linear("q_proj", h, n * qk)])
            return q + [Linear("kv_a_proj_with_mqa", h, self.kv_lora_rank + rope, bias=b),
                        Linear("kv_b_proj", self.kv_lora_rank, n * (qk - rope + self.v_head_dim)),
                        Linear("o_proj", n * self.v_head_dim, h, bias=b)]
        classic = self.model_type in _CLASSIC
        bias = self.model_type in _QKV_BIAS or classic or self.attention_bias
        return [Linear("q_proj", h, self.q_dim, bias=bias), Linear("k_proj", h, self.kv_dim, bias=bias),
                Linear("v_proj", h, self.kv_dim, bias=bias),
                Linear("o_proj", self.q_dim, h, bias=classic or self.attention_bias)]

    def dense_mlp_linears(self) -> list[Linear]:
        """The MLP of a dense layer (of a dense model, or an MoE model's dense layers)."""
        h, i = self.hidden_size, self.intermediate_size
        if not self.gated_mlp:
            return [Linear("up_proj", h, i, bias=True), Linear("down_proj", i, h, bias=True)]
        b = self.mlp_bias
        return [Linear("gate_proj", h, i, bias=b), Linear("up_proj", h, i, bias=b), Linear("down_proj", i, h, bias=b)]

    def mlp_linears(self) -> list[Linear]:
        """The MLP of the model's typical layer: routed experts for MoE models."""
        if not self.is_moe:
            return self.dense_mlp_linears()
        h, e, i = self.hidden_size, self.num_experts, self.moe_intermediate_size
        b = self.model_type == "gpt_oss"  # gpt-oss biases its router and experts
        out = [Linear(self.router_name, h, e, bias=b),
               Linear("experts.gate_proj", h, i, count=e, bias=b), Linear("experts.up_proj", h, i, count=e, bias=b),
               Linear("experts.down_proj", i, h, count=e, bias=b)]
        s, name = self.shared_expert_intermediate_size, self.shared_expert_name
        if s:
            out += [Linear(f"{name}.gate_proj", h, s), Linear(f"{name}.up_proj", h, s),
                    Linear(f"{name}.down_proj", s, h)]
            if self.shared_expert_gate:
                out.append(Linear("shared_expert_gate", h, 1))
        return out

    def layer_linears(self) -> list[Linear]:
        """Every linear of one decoder layer (an MoE layer for MoE models)."""
        return self.attention_linears() + self.mlp_linears()

    # ------------------------------------------------------------------ counts
    def norm_params(self) -> int:
        """Normalisation weights of one decoder layer."""
        h = self.hidden_size
        if self.model_type in _CLASSIC:
            # LayerNorm has weight and bias; Phi-2 uses one shared norm for its parallel block.
            return 2 * h if self.model_type == "phi" else 4 * h
        norms = 4 * h if self.model_type in _FOUR_NORMS else 2 * h
        if self.model_type in _QK_NORM:
            norms += 2 * self.head_dim
        elif self.model_type == "olmo2":  # OLMo 2 normalises the full query and key projections
            norms += self.q_dim + self.kv_dim
        if self.is_mla:
            norms += self.q_lora_rank + self.kv_lora_rank  # q_a_layernorm, kv_a_layernorm
        return norms

    def other_layer_params(self) -> int:
        """Per-layer parameters outside linears and norms: gpt-oss's attention sinks (one per head)."""
        return self.num_heads if self.model_type == "gpt_oss" else 0

    def layer_params(self) -> int:
        """Parameters of one decoder layer (all experts; the largest layer of an MoE model)."""
        return sum(lin.params for lin in self.layer_linears()) + self.norm_params() + self.other_layer_params()

    def dense_layer_params(self) -> int:
        """Parameters of one dense decoder layer."""
        return (sum(lin.params for lin in self.attention_linears() + self.dense_mlp_linears())
                + self.norm_params() + self.other_layer_params())

    def active_layer_params(self) -> int:
        """Parameters of one decoder layer a single token uses (routed experts: only its top-k)."""
        if not self.is_moe:
            return self.layer_params()
        total = 0
        for lin in self.layer_linears():
            count = self.experts_per_token if lin.name.startswith("experts.") else lin.count
            total += count * (lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0))
        return total + self.norm_params() + self.other_layer_params()

    def decoder_params(self, active: bool = False) -> int:
        """All decoder layers together (`active`: what one token uses)."""
        if not self.is_moe:
            return self.num_layers * self.layer_params()
        moe = self.active_layer_params() if active else self.layer_params()
        return self.moe_layers * moe + self.dense_layer_count * self.dense_layer_params()

    def embedding_params(self) -> int:
        """Input embeddings (plus learned positions for GPT-2)."""
        pos = self.max_position_embeddings * self.hidden_size if self.model_type == "gpt2" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Output projection (0 when tied to the input embeddings). A sequence-classification head
        (`score`, no bias) is never tied: num_labels x hidden."""
        if self.num_labels:
            return self.num_labels * self.hidden_size
        if self.tie_embeddings:
            return 0
        bias = self.vocab_size if self.model_type == "phi" else 0
        return self.vocab_size * self.hidden_size + bias

    def final_norm_params(self) -> int:
        return 2 * self.hidden_size if self.model_type in _CLASSIC else self.hidden_size

    def text_params(self) -> int:
        """The language model's parameters (tied embeddings counted once)."""
        return self.embedding_params() + self.decoder_params() + self.final_norm_params() + self.head_params()

    def vision_params(self) -> int:
        """A vision-language model's vision tower and projector (0 for a text-only model)."""
        return self.vision.params if self.vision is not None else 0

    def total_params(self) -> int:
        """All parameters (tied embeddings counted once): the language model and any vision tower."""
        return self.text_params() + self.vision_params()

    def active_params(self) -> int:
        """Parameters used per token (equals `total_params` for dense models)."""
        return (self.embedding_params() + self.decoder_params(active=True)
                + self.final_norm_params() + self.head_params() + self.vision_params())

    def linear_params(self) -> int:
        """Parameters inside the decoder layers' linear weights, routed experts included (QLoRA
        quantizes `quantized_params`)."""
        def weights(linears: list[Linear]) -> int:
            return sum(lin.count * lin.in_features * lin.out_features for lin in linears)

        if not self.is_moe:
            return self.num_layers * weights(self.layer_linears())
        return (self.moe_layers * weights(self.layer_linears())
                + self.dense_layer_count * weights(self.attention_linears() + self.dense_mlp_linears()))

    def nn_linears(self) -> list[Linear]:
        """The linears of a layer that transformers builds as ``nn.Linear`` (what bitsandbytes quantizes
        and peft's ``all-linear`` reaches): in transformers 5 routers and routed experts are plain
        parameters (experts fused into 3-D tensors), so neither counts."""
        return [lin for lin in self.layer_linears()
                if not lin.name.startswith("experts.") and not (self.is_moe and lin.name == self.router_name)]

    def quantized_params(self) -> int:
        """Decoder weights a 4/8-bit QLoRA base holds quantized: every ``nn.Linear`` weight; an MoE
        model's routers and routed experts stay in the load dtype."""
        def weights(linears: list[Linear]) -> int:
            return sum(lin.count * lin.in_features * lin.out_features for lin in linears)

        # transformers' bitsandbytes integration replaces every nn.Linear but the output layer, so a
        # vision tower's and projector's linears are quantized as well
        vision = self.vision.linear_weight_params() if self.vision is not None else 0
        if not self.is_moe:
            return self.linear_params() + vision
        return (self.moe_layers * weights(self.nn_linears())
                + self.dense_layer_count * weights(self.attention_linears() + self.dense_mlp_linears()) + vision)

    def _all_linears(self) -> list[Linear]:
        return self.layer_linears() + (self.dense_mlp_linears() if self.is_moe and self.dense_layers else [])

    def largest_module_params(self) -> int:
        """The largest single module (DeepSpeed's ``largest_layer_params``): usually the embedding."""
        return max(self.vocab_size * self.hidden_size, self.largest_linear_params())

    def largest_linear_params(self) -> int:
        return max(lin.in_features * lin.out_features for lin in self._all_linears())

    def train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3 x forward): 6 per active weight a token
        multiplies with (the input embedding is a lookup, not a product), plus the attention scores
        and their weighted sum over `seq_len` positions (Kaplan et al. 2020, Sec. 2.1; Chowdhery et
        al. 2022, App. B: 6N + 12·L·d_attn·T). MoE models count only the experts a token is routed to."""
        weights, per_position = self.flops_terms()
        return weights + per_position * seq_len

    def flops_terms(self) -> tuple[float, float]:
        """(training FLOPs per token from the active weights, attention FLOPs per token and position)."""
        # the language model's tokens only: images pass the vision tower once, not per text token
        matmul = self.active_params() - self.vision_params() - self.vocab_size * self.hidden_size
        if self.model_type == "gpt2":
            matmul -= self.max_position_embeddings * self.hidden_size  # learned positions: a lookup
        if self.tie_embeddings and not self.num_labels:
            matmul += self.vocab_size * self.hidden_size  # the tied matrix still projects to the vocabulary
        v_width = self.v_head_dim if self.is_mla else self.head_dim
        return 6.0 * matmul, 6.0 * self.num_layers * self.num_heads * (self.head_dim + v_width)

    @property
    def output_width(self) -> int:
        """Outputs per token of the head: the vocabulary, or a classification head's labels."""
        return self.num_labels or self.vocab_size

    def summary(self) -> dict[str, Any]:
        """Counts for plan output."""
        out: dict[str, Any] = {"name": self.name, "model_type": self.model_type, "params": self.total_params(),
               "layers": self.num_layers, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}
        weights, per_position = self.flops_terms()
        out.update(train_flops_per_token=weights, attention_flops_per_position=per_position)
        if self.num_labels:
            out["head"] = f"sequence classification ({self.num_labels} output{'s' if self.num_labels > 1 else ''})"
        if self.is_moe:
            out.update(active_params=self.active_params(), experts=self.num_experts,
                       experts_per_token=self.experts_per_token)
            if self.dense_layers:
                out["dense_layers"] = len(self.dense_layers)
        return out


def human_count(n: float) -> str:
    """``8.03B``, ``207.1M``, ``12.3K``: parameter counts for people."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}" if unit in ("T", "B") else f"{n / scale:.1f}{unit}"
    return str(int(n))


def spec_from_config(config: dict[str, Any], name: str = "") -> ModelSpec:
    """A `ModelSpec` from a transformers ``config.json`` dict. Multimodal configs contribute their
    ``text_config``; unknown model types are counted as Llama-style decoders (noted in `notes`)."""
    notes: list[str] = []
    cfg = _language_config(config, notes)
    model_type = _model_type(cfg, notes)
    vision = vision_from_config(config, int(cfg.get("hidden_size") or 0))
    _multimodal_notes(config, vision, notes)
    if model_type == "gpt2":
        return _gpt2_spec(cfg, name, notes)

    hidden = _req(cfg, "hidden_size", name)
    heads = _req(cfg, "num_attention_heads", name)
    layers = _req(cfg, "num_hidden_layers", name)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    experts, moe_i, shared, shared_gate = _moe_sizes(cfg)
    mla = {}
    if cfg.get("kv_lora_rank"):
        # DeepSeek MLA: a query/key head is its no-rope part plus its rotary part; keys and values
        # are expanded to every head, so the memory model sees multi-head attention.
        rope = int(cfg.get("qk_rope_head_dim") or 0)
        head_dim = int(cfg.get("qk_nope_head_dim") or 0) + rope
        kv_heads = heads
        mla = dict(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                   qk_rope_head_dim=rope, v_head_dim=int(cfg.get("v_head_dim") or head_dim))
    default_tie = model_type in {"gemma", "gemma2", "gemma3_text", "starcoder2"}
    # gpt-oss biases its attention unless the config says otherwise; DeepSeek, Llama and Qwen3 read the key.
    attention_bias = bool(cfg.get("attention_bias", model_type == "gpt_oss"))
    return ModelSpec(
        model_type=model_type, vocab_size=_req(cfg, "vocab_size", name), hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size") or 4 * hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", default_tie)),
        num_experts=experts, experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(moe_i or 0), shared_expert_intermediate_size=shared if experts else 0,
        shared_expert_gate=shared_gate and bool(experts),
        dense_layers=_dense_layers(cfg, layers) if experts else (),
        attention_bias=attention_bias and model_type not in _QKV_BIAS and model_type not in _CLASSIC,
        mlp_bias=bool(cfg.get("mlp_bias", False)) and model_type not in _CLASSIC, **mla,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 0), vision=vision, name=name,
        notes=tuple(notes))


def _language_config(config: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The language model's config: a multimodal config's ``text_config``, else the config itself
    (Qwen2-VL and Qwen2.5-VL also store their text fields at the top, next to ``vision_config``)."""
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", text.get("tie_word_embeddings")))
        cfg = text
    return cfg


def _multimodal_notes(config: dict[str, Any], vision: VisionSpec | None, notes: list[str]) -> None:
    """Say which towers of a multimodal config the count leaves out (or counts approximately)."""
    if isinstance(config.get("vision_config"), dict) and vision is None:
        notes.append(f"model_type '{config.get('model_type')}': its vision tower is not sized (the planner reads "
                     "Qwen2/2.5/3-VL, LLaVA, Gemma 3 and Mllama vision configs); counted the language model only")
    elif isinstance(config.get("text_config"), dict) and vision is None:
        notes.append("counted the language model only (text_config); other towers are not included")
    if isinstance(config.get("audio_config"), dict):
        notes.append("counted without the audio tower (audio_config is not sized)")
    if vision is not None and vision.approximate:
        notes.append(vision.approximate)


def _model_type(cfg: dict[str, Any], notes: list[str]) -> str:
    """The config's model type as the planner counts it (Gemma 3's text model for ``gemma3``)."""
    model_type = str(cfg.get("model_type", "llama"))
    if model_type == "gemma3":
        model_type = "gemma3_text"
    # Qwen-VL's language models by the type of the whole model (flat configs carry only that one),
    # whose decoder layer class FSDP wraps and which has no tensor-parallel plan
    model_type = {"qwen2_vl_text": "qwen2_vl", "qwen2_5_vl_text": "qwen2_5_vl",
                  "qwen3_vl_text": "qwen3_vl"}.get(model_type, model_type)
    if model_type not in DECODER_LAYER_CLASS:
        notes.append(f"model_type '{model_type}' is counted as a Llama-style decoder")
    return model_type


def _gpt2_spec(cfg: dict[str, Any], name: str, notes: list[str]) -> ModelSpec:
    """GPT-2 names its sizes differently (n_embd, n_head, n_layer, n_inner, n_positions)."""
    hidden = _req(cfg, "n_embd", name)
    heads = _req(cfg, "n_head", name)
    return ModelSpec(
        model_type="gpt2", vocab_size=_req(cfg, "vocab_size", name), hidden_size=hidden,
        intermediate_size=cfg.get("n_inner") or 4 * hidden, num_layers=_req(cfg, "n_layer", name),
        num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        tie_embeddings=cfg.get("tie_word_embeddings", True),
        max_position_embeddings=cfg.get("n_positions", 1024), name=name, notes=tuple(notes))


def _moe_sizes(cfg: dict[str, Any]) -> tuple[int, Any, int, bool]:
    """(routed experts, expert MLP width, shared-expert width, whether shared experts are gated);
    0 experts for a dense model."""
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    moe_i = cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0)
    # Shared experts: Qwen2-MoE gives their width (and gates them), DeepSeek a count of expert-wide MLPs.
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    shared_gate = shared > 0
    if not shared and cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * int(moe_i or 0)
    return experts, moe_i, shared, shared_gate


def _dense_layers(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Indices of an MoE model's layers that keep a dense MLP, by the config keys each family uses:
    DeepSeek's `first_k_dense_replace` and `moe_layer_freq` (a layer is MoE from the k-th on, every
    freq-th), Qwen-MoE's `decoder_sparse_step` (every step-th layer, counting from 1) and
    `mlp_only_layers`. Mixtral and gpt-oss route in every layer."""
    first_k = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = {int(i) for i in (cfg.get("mlp_only_layers") or [])}
    return tuple(i for i in range(layers)
                 if i < first_k or i % freq != 0 or (i + 1) % step != 0 or i in dense_only)


def _req(cfg: dict[str, Any], key: str, name: str) -> int:
    from recipeforge.errors import RecipeError

    if cfg.get(key) is None:
        raise RecipeError(f"config.json of '{name or 'the model'}' has no '{key}'; cannot count its parameters",
                          key="model.name_or_path",
                          hint="use a decoder-only transformers model (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...)")
    return int(cfg[key])
