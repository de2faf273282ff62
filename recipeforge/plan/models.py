"""Decoder-only architectures as numbers: parameter counts without weights.

A `ModelSpec` is read from a Hugging Face ``config.json`` dict (`spec_from_config`). Counts are exact
sums over the modules transformers builds for that architecture (Llama, Mistral, Mixtral, Qwen2/3
and their MoE variants, Gemma 1/2/3, Phi-2/3, GPT-2), so they match the published sizes; MoE models
report both the total and the active (per-token) count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# model_type -> decoder layer class (FSDP wraps these; they are also transformers' _no_split_modules).
DECODER_LAYER_CLASS = {
    "llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer", "qwen2_moe": "Qwen2MoeDecoderLayer", "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer", "gemma": "GemmaDecoderLayer", "gemma2": "Gemma2DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer", "phi3": "Phi3DecoderLayer", "phi": "PhiDecoderLayer",
    "gpt2": "GPT2Block", "olmo2": "Olmo2DecoderLayer", "starcoder2": "Starcoder2DecoderLayer",
}
# Architectures whose attention projections carry biases (q, k, v; not o).
_QKV_BIAS = {"qwen2", "qwen2_moe"}
# Architectures with a per-head RMSNorm on queries and keys.
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text"}
# Gemma 2/3 normalise before and after both sub-blocks: four norms per layer.
_FOUR_NORMS = {"gemma2", "gemma3_text"}
# Non-gated MLPs with biases and LayerNorm (weight + bias).
_CLASSIC = {"gpt2", "phi", "starcoder2"}


@dataclass(frozen=True)
class Linear:
    """A linear projection inside one decoder layer (per layer, counted `count` times)."""

    name: str
    in_features: int
    out_features: int
    count: int = 1          # e.g. the number of experts holding this projection
    bias: bool = False

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


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
    head_dim: int
    tie_embeddings: bool
    num_experts: int = 0                  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 0      # only GPT-2 stores positions as parameters
    name: str = ""
    notes: tuple[str, ...] = field(default=())

    # ------------------------------------------------------------------ shape helpers
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
        """Hidden width of the MLP one token actually passes through (sum over its experts)."""
        if not self.is_moe:
            return self.intermediate_size
        return self.experts_per_token * self.moe_intermediate_size + self.shared_expert_intermediate_size

    @property
    def gated_mlp(self) -> bool:
        return self.model_type not in _CLASSIC

    # ------------------------------------------------------------------ linears
    def attention_linears(self) -> list[Linear]:
        h, bias = self.hidden_size, self.model_type in _QKV_BIAS or self.model_type in _CLASSIC
        return [Linear("q_proj", h, self.q_dim, bias=bias), Linear("k_proj", h, self.kv_dim, bias=bias),
                Linear("v_proj", h, self.kv_dim, bias=bias),
                Linear("o_proj", self.q_dim, h, bias=self.model_type in _CLASSIC)]

    def mlp_linears(self) -> list[Linear]:
        h = self.hidden_size
        if not self.gated_mlp:
            i = self.intermediate_size
            return [Linear("up_proj", h, i, bias=True), Linear("down_proj", i, h, bias=True)]
        if not self.is_moe:
            i = self.intermediate_size
            return [Linear("gate_proj", h, i), Linear("up_proj", h, i), Linear("down_proj", i, h)]
        e, i = self.num_experts, self.moe_intermediate_size
        out = [Linear("gate", h, e),  # the router
               Linear("experts.gate_proj", h, i, count=e), Linear("experts.up_proj", h, i, count=e),
               Linear("experts.down_proj", i, h, count=e)]
        s = self.shared_expert_intermediate_size
        if s:
            out += [Linear("shared_expert.gate_proj", h, s), Linear("shared_expert.up_proj", h, s),
                    Linear("shared_expert.down_proj", s, h), Linear("shared_expert_gate", h, 1)]
        return out

    def layer_linears(self) -> list[Linear]:
        """Every linear of one decoder layer."""
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
        return norms

    def layer_params(self) -> int:
        """Parameters of one decoder layer (all experts)."""
        return sum(lin.params for lin in self.layer_linears()) + self.norm_params()

    def active_layer_params(self) -> int:
        """Parameters of one decoder layer a single token uses (routed experts: only its top-k)."""
        if not self.is_moe:
            return self.layer_params()
        total = 0
        for lin in self.layer_linears():
            count = self.experts_per_token if lin.name.startswith("experts.") else lin.count
            total += count * (lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0))
        return total + self.norm_params()

    def embedding_params(self) -> int:
        """Input embeddings (plus learned positions for GPT-2)."""
        pos = self.max_position_embeddings * self.hidden_size if self.model_type == "gpt2" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Output projection (0 when tied to the input embeddings)."""
        if self.tie_embeddings:
            return 0
        bias = self.vocab_size if self.model_type == "phi" else 0
        return self.vocab_size * self.hidden_size + bias

    def final_norm_params(self) -> int:
        return 2 * self.hidden_size if self.model_type in _CLASSIC else self.hidden_size

    def total_params(self) -> int:
        """All parameters (tied embeddings counted once)."""
        return (self.embedding_params() + self.num_layers * self.layer_params()
                + self.final_norm_params() + self.head_params())

    def active_params(self) -> int:
        """Parameters used per token (equals `total_params` for dense models)."""
        return (self.embedding_params() + self.num_layers * self.active_layer_params()
                + self.final_norm_params() + self.head_params())

    def linear_params(self) -> int:
        """Parameters inside the decoder layers' linear weights (what 4-bit QLoRA quantizes)."""
        return self.num_layers * sum(lin.count * lin.in_features * lin.out_features for lin in self.layer_linears())

    def largest_module_params(self) -> int:
        """The largest single module (DeepSpeed's ``largest_layer_params``): usually the embedding."""
        biggest_linear = max(lin.in_features * lin.out_features for lin in self.layer_linears())
        return max(self.vocab_size * self.hidden_size, biggest_linear)

    def largest_linear_params(self) -> int:
        return max(lin.in_features * lin.out_features for lin in self.layer_linears())

    def summary(self) -> dict:
        """Counts for plan output."""
        out = {"name": self.name, "model_type": self.model_type, "params": self.total_params(),
               "layers": self.num_layers, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}
        if self.is_moe:
            out.update(active_params=self.active_params(), experts=self.num_experts,
                       experts_per_token=self.experts_per_token)
        return out


def human_count(n: float) -> str:
    """``8.03B``, ``207.1M``, ``12.3K``: parameter counts for people."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}" if unit in ("T", "B") else f"{n / scale:.1f}{unit}"
    return str(int(n))


def spec_from_config(config: dict, name: str = "") -> ModelSpec:
    """A `ModelSpec` from a transformers ``config.json`` dict. Multimodal configs contribute their
    ``text_config``; unknown model types are counted as Llama-style decoders (noted in `notes`)."""
    notes: list[str] = []
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", text.get("tie_word_embeddings")))
        cfg = text
        notes.append("counted the language model only (text_config); vision/audio towers are not included")
    model_type = str(cfg.get("model_type", "llama"))
    if model_type == "gemma3":
        model_type = "gemma3_text"
    if model_type not in DECODER_LAYER_CLASS:
        notes.append(f"model_type '{model_type}' is counted as a Llama-style decoder")

    if model_type == "gpt2":
        hidden = _req(cfg, "n_embd", name)
        heads = _req(cfg, "n_head", name)
        return ModelSpec(
            model_type="gpt2", vocab_size=_req(cfg, "vocab_size", name), hidden_size=hidden,
            intermediate_size=cfg.get("n_inner") or 4 * hidden, num_layers=_req(cfg, "n_layer", name),
            num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
            tie_embeddings=cfg.get("tie_word_embeddings", True),
            max_position_embeddings=cfg.get("n_positions", 1024), name=name, notes=tuple(notes))

    hidden = _req(cfg, "hidden_size", name)
    heads = _req(cfg, "num_attention_heads", name)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    moe_i = cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0)
    default_tie = model_type in {"gemma", "gemma2", "gemma3_text"}
    return ModelSpec(
        model_type=model_type, vocab_size=_req(cfg, "vocab_size", name), hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size") or 4 * hidden, num_layers=_req(cfg, "num_hidden_layers", name),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", default_tie)),
        num_experts=int(experts), experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(moe_i or 0),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 0), name=name, notes=tuple(notes))


def _req(cfg: dict, key: str, name: str):
    from recipeforge.errors import RecipeError

    if cfg.get(key) is None:
        raise RecipeError(f"config.json of '{name or 'the model'}' has no '{key}'; cannot count its parameters",
                          key="model.name_or_path",
                          hint="use a decoder-only transformers model (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...)")
    return int(cfg[key])
