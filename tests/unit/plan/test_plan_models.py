"""Parameter counts without weights: published sizes, MoE total/active, config sources."""

from __future__ import annotations

import json

import pytest

from recipeforge.components.tiny_spec import TINY_CONFIGS
from recipeforge.errors import RecipeError
from recipeforge.plan.catalog import KNOWN_CONFIGS, resolve_model
from recipeforge.plan.models import spec_from_config

# Sizes as the model cards / hub pages publish them (total; active for MoE).
PUBLISHED = [
    ("meta-llama/Llama-3.1-8B", 8.03e9, None),
    ("meta-llama/Llama-3.1-70B", 70.6e9, None),
    ("meta-llama/Llama-3.1-405B", 405.9e9, None),
    ("meta-llama/Llama-3.2-1B", 1.24e9, None),
    ("meta-llama/Llama-3.2-3B", 3.21e9, None),
    ("Qwen/Qwen2.5-0.5B", 0.49e9, None),
    ("Qwen/Qwen2.5-7B", 7.61e9, None),
    ("Qwen/Qwen2.5-72B", 72.7e9, None),
    ("Qwen/Qwen3-8B", 8.2e9, None),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("Qwen/Qwen1.5-MoE-A2.7B", 14.3e9, 2.7e9),
    ("mistralai/Mistral-7B-v0.1", 7.24e9, None),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),
    ("mistralai/Mixtral-8x22B-v0.1", 141e9, 39e9),
    ("google/gemma-7b", 8.54e9, None),
    ("google/gemma-2-9b", 9.24e9, None),
    ("microsoft/phi-2", 2.78e9, None),
    ("microsoft/Phi-3-mini-4k-instruct", 3.82e9, None),
    ("microsoft/phi-4", 14.7e9, None),
    ("openai-community/gpt2", 124e6, None),
    ("openai-community/gpt2-xl", 1.56e9, None),
]


@pytest.mark.parametrize("model_id, total, active", PUBLISHED)
def test_counts_match_published_sizes(model_id, total, active):
    spec, source = resolve_model(model_id, allow_hub=False)
    assert "built-in" in source
    assert spec.total_params() == pytest.approx(total, rel=0.01)
    if active is None:
        assert spec.active_params() == spec.total_params()
    else:
        assert spec.is_moe and spec.active_params() == pytest.approx(active, rel=0.03)


def test_exact_counts_of_well_known_checkpoints():
    # safetensors metadata of the hub checkpoints (tied embeddings counted once)
    exact = {"meta-llama/Llama-3.1-8B": 8_030_261_248, "meta-llama/Llama-3.1-70B": 70_553_706_496,
             "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704, "openai-community/gpt2": 124_439_808}
    for model_id, count in exact.items():
        assert resolve_model(model_id, allow_hub=False)[0].total_params() == count


def test_variants_and_aliases_share_the_base_shape():
    base = resolve_model("meta-llama/Llama-3.1-8B", allow_hub=False)[0].total_params()
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B", "META-LLAMA/llama-3.1-8b"):
        assert resolve_model(name, allow_hub=False)[0].total_params() == base


def test_tiny_models_are_sized_from_tiny_spec():
    for arch, cfg in TINY_CONFIGS.items():
        if "text_config" in cfg:  # a vision-language model: tests/unit/plan/test_plan_vision.py sizes those
            continue
        spec, source = resolve_model(f"tiny:{arch}")
        if "num_experts" in cfg:  # a mixture of experts: counted as transformers builds it
            assert spec.total_params() == _built_params(cfg) and source == "built-in tiny model"
            continue
        h, i, v, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
        bias = 2 * kv + h if cfg["model_type"] == "qwen2" else 0  # Qwen2 has q/k/v biases
        layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h + bias
        head = 0 if cfg["tie_word_embeddings"] else v * h
        assert spec.total_params() == v * h + layers * layer + h + head
        assert source == "built-in tiny model"


def _built_params(cfg: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_unknown_tiny_arch():
    with pytest.raises(RecipeError) as err:
        resolve_model("tiny:lama")
    assert "tiny:llama" in err.value.problems[0].hint or "llama" in err.value.problems[0].hint


def test_local_config_directory(tmp_path):
    cfg = dict(KNOWN_CONFIGS["mistralai/Mistral-7B-v0.1"], architectures=["MistralForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec, source = resolve_model(str(tmp_path))
    assert spec.total_params() == pytest.approx(7.24e9, rel=0.01)
    assert source.endswith("config.json")


def test_multimodal_config_counts_its_text_model(tmp_path):
    text = dict(KNOWN_CONFIGS["google/gemma-2-9b"])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "some_vlm", "text_config": text}))
    spec, _ = resolve_model(str(tmp_path))
    assert spec.total_params() == resolve_model("google/gemma-2-9b", allow_hub=False)[0].total_params()
    assert any("text_config" in n for n in spec.notes)


def test_directory_without_config(tmp_path):
    with pytest.raises(RecipeError, match="without config.json"):
        resolve_model(str(tmp_path))


def test_unknown_id_offline_explains(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RecipeError) as err:
        resolve_model("someone/unknown-model-7B")
    problem = err.value.problems[0]
    assert "HF_HUB_OFFLINE" in problem.message and problem.key == "model.name_or_path"
    assert "use a local directory with config.json, or one of the " in problem.hint
    examples = problem.hint.split("e.g. ")[1].split(", ")
    assert 1 <= len(examples) <= 6  # a few ids, not the whole table


def test_unreachable_hub_is_reported_at_once(monkeypatch):
    import time

    for var in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.monotonic()
    with pytest.raises(RecipeError) as err:
        resolve_model("someone/unknown-model-7B")
    assert "the hub (127.0.0.1) is not reachable from here" in err.value.problems[0].message
    assert time.monotonic() - start < 10  # not the client's half-minute of retries


def test_moe_structure():
    spec = spec_from_config(KNOWN_CONFIGS["mistralai/Mixtral-8x7B-v0.1"])
    assert spec.num_experts == 8 and spec.experts_per_token == 2
    assert spec.mlp_width == 2 * 14336
    dense = spec_from_config(KNOWN_CONFIGS["mistralai/Mistral-7B-v0.1"])
    # Mixtral = Mistral with 8 experts and a router: the difference is 7 extra expert MLPs + routers
    extra = spec.num_layers * (7 * 3 * 4096 * 14336 + 4096 * 8)
    assert spec.total_params() == dense.total_params() + extra


def test_largest_module_is_the_embedding_for_llama():
    spec = spec_from_config(KNOWN_CONFIGS["meta-llama/Llama-3.1-8B"])
    assert spec.largest_module_params() == 128256 * 4096
    assert spec.decoder_layer_class == "LlamaDecoderLayer"
