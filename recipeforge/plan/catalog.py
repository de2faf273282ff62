"""Where a model's shape comes from: ``tiny:<arch>``, a local config.json, the built-in table of
well-known hub ids, a plugin, or (when online) the hub's config.json.

The built-in table holds only the fields the parameter count needs, copied from each model's
config.json on the hub. It registers in the `models` registry exactly as plugins do; plugins add ids
through the ``recipeforge.models`` entry-point group (name: the model id, object: a
`components.models.ModelEntry` or a plain config mapping). Plugin entry points are read only for an
id that is neither local, tiny nor in the table.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from pathlib import Path
from typing import Any

from recipeforge.components.models import models
from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
from recipeforge.errors import RecipeError, did_you_mean
from recipeforge.plan.models import ModelSpec, spec_from_config


def _llama(v: int, h: int, i: int, layers: int, heads: int, kv: int, tie: bool = False, model_type: str = "llama",
           **extra: Any) -> dict[str, Any]:
    return dict(model_type=model_type, vocab_size=v, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tie, **extra)


def _qwen25_vision(out_hidden_size: int) -> dict[str, Any]:
    """The `vision_config` of the published Qwen2.5-VL checkpoints (3B, 7B; 72B the same ViT)."""
    return dict(depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16, in_chans=3,
                out_hidden_size=out_hidden_size, patch_size=14, spatial_merge_size=2, spatial_patch_size=14,
                window_size=112, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, temporal_patch_size=2)


KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # Meta Llama 3.x
    "meta-llama/Llama-3.1-8B": _llama(128256, 4096, 14336, 32, 32, 8),
    "meta-llama/Llama-3.1-70B": _llama(128256, 8192, 28672, 80, 64, 8),
    "meta-llama/Llama-3.1-405B": _llama(128256, 16384, 53248, 126, 128, 8),
    "meta-llama/Llama-3.2-1B": _llama(128256, 2048, 8192, 16, 32, 8, tie=True, head_dim=64),
    "meta-llama/Llama-3.2-3B": _llama(128256, 3072, 8192, 28, 24, 8, tie=True, head_dim=128),
    "meta-llama/Llama-3.3-70B-Instruct": _llama(128256, 8192, 28672, 80, 64, 8),
    # Meta Llama 2 (multi-head attention at 7B/13B, grouped-query at 70B; 32000-token vocabulary)
    "meta-llama/Llama-2-7b-hf": _llama(32000, 4096, 11008, 32, 32, 32),
    "meta-llama/Llama-2-13b-hf": _llama(32000, 5120, 13824, 40, 40, 40),
    "meta-llama/Llama-2-70b-hf": _llama(32000, 8192, 28672, 80, 64, 8),
    # Mistral
    "mistralai/Mistral-7B-v0.1": _llama(32000, 4096, 14336, 32, 32, 8, model_type="mistral"),
    "mistralai/Mistral-7B-v0.3": _llama(32768, 4096, 14336, 32, 32, 8, model_type="mistral"),
    "mistralai/Mixtral-8x7B-v0.1": _llama(32000, 4096, 14336, 32, 32, 8, model_type="mixtral",
                                          num_local_experts=8, num_experts_per_tok=2),
    "mistralai/Mixtral-8x22B-v0.1": _llama(32768, 6144, 16384, 56, 48, 8, model_type="mixtral",
                                           num_local_experts=8, num_experts_per_tok=2),
    # Qwen 2.5
    "Qwen/Qwen2.5-0.5B": _llama(151936, 896, 4864, 24, 14, 2, tie=True, model_type="qwen2"),
    "Qwen/Qwen2.5-1.5B": _llama(151936, 1536, 8960, 28, 12, 2, tie=True, model_type="qwen2"),
    "Qwen/Qwen2.5-3B": _llama(151936, 2048, 11008, 36, 16, 2, tie=True, model_type="qwen2"),
    "Qwen/Qwen2.5-7B": _llama(152064, 3584, 18944, 28, 28, 4, model_type="qwen2"),
    "Qwen/Qwen2.5-14B": _llama(152064, 5120, 13824, 48, 40, 8, model_type="qwen2"),
    "Qwen/Qwen2.5-32B": _llama(152064, 5120, 27648, 64, 40, 8, model_type="qwen2"),
    "Qwen/Qwen2.5-72B": _llama(152064, 8192, 29568, 80, 64, 8, model_type="qwen2"),
    # Qwen 2.5-VL (flat layout as published: Qwen2.5's text fields next to `vision_config`; a 32-layer
    # 1280-wide ViT with window attention but in `fullatt_block_indexes`, merged 2x2 into the LLM's width)
    "Qwen/Qwen2.5-VL-7B-Instruct": _llama(152064, 3584, 18944, 28, 28, 4, model_type="qwen2_5_vl",
                                          vision_config=_qwen25_vision(3584)),
    "Qwen/Qwen2.5-VL-3B-Instruct": _llama(151936, 2048, 11008, 36, 16, 2, tie=True, model_type="qwen2_5_vl",
                                          vision_config=_qwen25_vision(2048)),
    # Qwen 3 (head_dim 128 throughout)
    "Qwen/Qwen3-0.6B": _llama(151936, 1024, 3072, 28, 16, 8, tie=True, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-1.7B": _llama(151936, 2048, 6144, 28, 16, 8, tie=True, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-4B": _llama(151936, 2560, 9728, 36, 32, 8, tie=True, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-8B": _llama(151936, 4096, 12288, 36, 32, 8, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-14B": _llama(151936, 5120, 17408, 40, 40, 8, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-32B": _llama(151936, 5120, 25600, 64, 64, 8, model_type="qwen3", head_dim=128),
    "Qwen/Qwen3-30B-A3B": _llama(151936, 2048, 6144, 48, 32, 4, model_type="qwen3_moe", head_dim=128,
                                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "Qwen/Qwen3-235B-A22B": _llama(151936, 4096, 12288, 94, 64, 4, model_type="qwen3_moe", head_dim=128,
                                   num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
    "Qwen/Qwen1.5-MoE-A2.7B": _llama(151936, 2048, 5632, 24, 16, 16, model_type="qwen2_moe",
                                     num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                                     shared_expert_intermediate_size=5632),
    # DeepSeek-V3 (MLA attention, 3 dense layers, 256 routed + 1 shared expert; the MTP module is not
    # built by transformers and not counted)
    "deepseek-ai/DeepSeek-V3": _llama(129280, 7168, 18432, 61, 128, 128, model_type="deepseek_v3",
                                      n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                                      moe_intermediate_size=2048, first_k_dense_replace=3, moe_layer_freq=1,
                                      q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                                      qk_nope_head_dim=128, v_head_dim=128),
    # OpenAI gpt-oss (biased attention and experts, attention sinks)
    "openai/gpt-oss-20b": _llama(201088, 2880, 2880, 24, 64, 8, model_type="gpt_oss", head_dim=64,
                                 num_local_experts=32, num_experts_per_tok=4),
    "openai/gpt-oss-120b": _llama(201088, 2880, 2880, 36, 64, 8, model_type="gpt_oss", head_dim=64,
                                  num_local_experts=128, num_experts_per_tok=4),
    # Google Gemma (tied embeddings)
    "google/gemma-2b": _llama(256000, 2048, 16384, 18, 8, 1, tie=True, model_type="gemma", head_dim=256),
    "google/gemma-7b": _llama(256000, 3072, 24576, 28, 16, 16, tie=True, model_type="gemma", head_dim=256),
    "google/gemma-2-2b": _llama(256000, 2304, 9216, 26, 8, 4, tie=True, model_type="gemma2", head_dim=256),
    "google/gemma-2-9b": _llama(256000, 3584, 14336, 42, 16, 8, tie=True, model_type="gemma2", head_dim=256),
    "google/gemma-2-27b": _llama(256000, 4608, 36864, 46, 32, 16, tie=True, model_type="gemma2", head_dim=128),
    # Microsoft Phi
    "microsoft/phi-2": _llama(51200, 2560, 10240, 32, 32, 32, model_type="phi"),
    "microsoft/Phi-3-mini-4k-instruct": _llama(32064, 3072, 8192, 32, 32, 32, model_type="phi3"),
    "microsoft/phi-4": _llama(100352, 5120, 17920, 40, 40, 10, model_type="phi3"),
    # OpenAI GPT-2
    "openai-community/gpt2": dict(model_type="gpt2", vocab_size=50257, n_embd=768, n_layer=12, n_head=12,
                                  n_positions=1024),
    "openai-community/gpt2-medium": dict(model_type="gpt2", vocab_size=50257, n_embd=1024, n_layer=24, n_head=16,
                                         n_positions=1024),
    "openai-community/gpt2-large": dict(model_type="gpt2", vocab_size=50257, n_embd=1280, n_layer=36, n_head=20,
                                        n_positions=1024),
    "openai-community/gpt2-xl": dict(model_type="gpt2", vocab_size=50257, n_embd=1600, n_layer=48, n_head=25,
                                     n_positions=1024),
}
# Other names for the same weights' shape.
ALIASES = {"gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
           "gpt2-large": "openai-community/gpt2-large", "gpt2-xl": "openai-community/gpt2-xl",
           "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
           "meta-llama/Meta-Llama-3.1-70B": "meta-llama/Llama-3.1-70B",
           "meta-llama/Meta-Llama-3.1-405B": "meta-llama/Llama-3.1-405B",
           "meta-llama/Meta-Llama-3-8B": "meta-llama/Llama-3.1-8B",
           "meta-llama/Meta-Llama-3-70B": "meta-llama/Llama-3.1-70B",
           "mistralai/Mistral-7B-Instruct-v0.1": "mistralai/Mistral-7B-v0.1",
           "mistralai/Mistral-7B-Instruct-v0.2": "mistralai/Mistral-7B-v0.1",
           "microsoft/Phi-3-mini-128k-instruct": "microsoft/Phi-3-mini-4k-instruct",
           "huggyllama/llama-7b": "meta-llama/Llama-2-7b-hf",
           "deepseek-ai/DeepSeek-V3-Base": "deepseek-ai/DeepSeek-V3",
           "deepseek-ai/DeepSeek-V3-0324": "deepseek-ai/DeepSeek-V3",
           "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-V3",
           "Qwen/Qwen3-30B-A3B-Base": "Qwen/Qwen3-30B-A3B",
           "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1"}  # LLaMA 1 7B: Llama 2 7B's shape
# Fine-tuned variants share the base model's shape.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it", "-hf", "-base")

ARCHITECTURES = models  # the registry of model ids (earlier name, kept for callers)
for _name, _cfg in KNOWN_CONFIGS.items():
    models.register(_name, _cfg)


def known_model_ids() -> list[str]:
    """Hub ids the planner can size offline (the built-in table)."""
    return sorted(KNOWN_CONFIGS)


def plugin_model_ids() -> list[str]:
    """Model ids installed plugins add (listed, not imported)."""
    return sorted(set(models.names()) - set(KNOWN_CONFIGS))


def resolve_model(name_or_path: str, revision: str | None = None, *, allow_hub: bool = True) -> tuple[ModelSpec, str]:
    """The `ModelSpec` for a recipe's `model.name_or_path` and where its shape came from."""
    arch = tiny_arch(name_or_path)
    if arch is not None:
        if arch not in TINY_CONFIGS:
            raise RecipeError(f"unknown tiny model '{name_or_path}'", key="model.name_or_path",
                              hint=did_you_mean(arch, TINY_CONFIGS)
                              or f"built-in: {', '.join('tiny:' + a for a in TINY_CONFIGS)}")
        return spec_from_config(TINY_CONFIGS[arch], name_or_path), "built-in tiny model"

    path = Path(name_or_path).expanduser()
    config_file = path / "config.json" if path.is_dir() else path if path.name == "config.json" else None
    if config_file is not None and config_file.is_file():
        return spec_from_config(_read_json(config_file), name_or_path), f"{config_file}"
    if path.is_dir():
        raise RecipeError(f"'{name_or_path}' is a directory without config.json", key="model.name_or_path",
                          hint="point model.name_or_path at a transformers model directory")

    known = _known(name_or_path)
    if known is not None:
        return spec_from_config(KNOWN_CONFIGS[known], name_or_path), f"built-in table ({known})"
    if models.has(name_or_path):  # a plugin's model id
        models.get(name_or_path, key="model.name_or_path")  # a broken plugin fails here, located
        entry = models.entry(name_or_path)
        version = f" {entry.version}" if entry.version else ""
        return spec_from_config(entry.obj.config, name_or_path), f"plugin {entry.source}{version}"
    if allow_hub and "/" in name_or_path:
        config, why = _hub_config(name_or_path, revision)
        if config is not None:
            return spec_from_config(config, name_or_path), "hub config.json"
    else:
        why = "not a hub id"
    ids = known_model_ids() + plugin_model_ids()
    # The closest ids, or else one per organisation: a few examples, not the whole table.
    close = difflib.get_close_matches(name_or_path, ids, n=6, cutoff=0.4) or \
        list({i.split("/")[0]: i for i in reversed(ids)}.values())[::-1][:6]
    raise RecipeError(
        f"cannot size model '{name_or_path}': not a local directory, not a known id, and {why}",
        key="model.name_or_path",
        hint=" ".join(filter(None, [did_you_mean(name_or_path, ids), "use a local directory with config.json, or one "
                                    f"of the {len(ids)} known ids, e.g. " + ", ".join(close)])))


def _known(name: str) -> str | None:
    """Exact or case-insensitive table id; fine-tuned variants map to their base id."""
    name = ALIASES.get(name, name)
    lowered = {k.lower(): k for k in KNOWN_CONFIGS}
    candidate = name.lower()
    for _ in range(3):
        if candidate in lowered:
            return lowered[candidate]
        alias = {a.lower(): t for a, t in ALIASES.items()}.get(candidate)
        if alias:
            return alias
        stripped = next((candidate[: -len(s)] for s in _VARIANT_SUFFIXES if candidate.endswith(s)), None)
        if stripped is None:
            return None
        candidate = stripped
    return None


def _hub_config(repo_id: str, revision: str | None) -> tuple[dict[str, Any] | None, str]:
    """config.json from the hub (or its local cache) when huggingface_hub is installed and online."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return None, "HF_HUB_OFFLINE is set"
    import importlib.util

    if importlib.util.find_spec("huggingface_hub") is None:
        return None, "huggingface_hub is not installed"
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache  # noqa: PLC0415 - only when needed

        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        if isinstance(cached, str):
            return _read_json(Path(cached)), ""
        unreachable = _hub_unreachable()
        if unreachable:
            return None, unreachable
        return _read_json(Path(hf_hub_download(repo_id, "config.json", revision=revision))), ""
    except Exception as exc:  # offline, gated, missing: all mean "cannot size from the hub"
        return None, f"its config.json could not be fetched ({type(exc).__name__})"


def _hub_unreachable(timeout: float = 3.0) -> str:
    """Why the hub cannot be reached ("" when it can, or when a proxy decides). A quick connect first,
    because the hub client retries a dead network with backoff for half a minute."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ""
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"the hub ({host}) is not reachable from here ({exc.strerror or type(exc).__name__})"
    return ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads(path.read_text())
        return config
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read {path}: {exc}", key="model.name_or_path") from None


def architecture_config(name_or_path: str, revision: str | None = None) -> dict[str, Any]:
    """The config.json fields of `name_or_path` for building it with random weights (`model.init:
    random`): a local directory's config.json, the built-in table or a plugin's config, else the
    hub's. The same sources the planner sizes the model from, so the model trained is the one planned."""
    arch = tiny_arch(name_or_path)
    if arch is not None and arch in TINY_CONFIGS:
        return dict(TINY_CONFIGS[arch])
    path = Path(name_or_path).expanduser()
    config_file = path / "config.json" if path.is_dir() else path if path.name == "config.json" else None
    if config_file is not None and config_file.is_file():
        return _read_json(config_file)
    known = _known(name_or_path)
    if known is not None:
        return dict(KNOWN_CONFIGS[known])
    if not path.exists() and models.has(name_or_path):
        return dict(models.get(name_or_path, key="model.name_or_path").config)
    config, why = _hub_config(name_or_path, revision) if "/" in name_or_path else (None, "not a hub id")
    if config is None:
        raise RecipeError(f"cannot build '{name_or_path}' with random weights: no config.json found ({why})",
                          key="model.name_or_path",
                          hint="point model.name_or_path at a directory with config.json, or use a known hub id "
                               "(`recipeforge plan` lists how a model is sized)")
    return config
