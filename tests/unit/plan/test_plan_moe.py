"""MoE-aware counts and the parameter-name layout, checked against the models transformers builds.

Tiny configs exercise every MoE config key the planner reads (routed/shared experts, top-k, dense
first-k layers, sparse steps, MLP-only layers, MLA attention, gpt-oss biases and sinks); models are
built on the meta device, so nothing is allocated. Published totals are checked for the catalog's
MoE models.
"""

from __future__ import annotations

import pytest

from recipeforge.components.tiny_spec import TINY_CONFIGS
from recipeforge.plan.catalog import KNOWN_CONFIGS, resolve_model
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.param_layout import VISION_LANGUAGE_PREFIX, parameter_layout

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, tie_word_embeddings=False)
TINY_MOE = {
    "mixtral": dict(_BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe-sparse-step": dict(_BASE, model_type="qwen3_moe", head_dim=8, num_experts=6, num_experts_per_tok=2,
                                  moe_intermediate_size=16, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen2_moe-shared": dict(_BASE, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=16, shared_expert_intermediate_size=40, mlp_only_layers=[0]),
    "deepseek_v3-mla": dict(_BASE, model_type="deepseek_v3", num_key_value_heads=4, n_routed_experts=8,
                            n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=16,
                            first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=4,
                            qk_nope_head_dim=8, v_head_dim=12, n_group=2, topk_group=1),
    "deepseek_v3-no-q-lora": dict(_BASE, model_type="deepseek_v3", num_key_value_heads=4, n_routed_experts=4,
                                  n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                                  first_k_dense_replace=2, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=4,
                                  qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1, attention_bias=True),
    "gpt_oss": dict(_BASE, model_type="gpt_oss", head_dim=8, num_local_experts=4, num_experts_per_tok=2),
}
DENSE_EXTRA = {
    "llama-biases": dict(_BASE, model_type="llama", attention_bias=True, mlp_bias=True),
    "olmo2": dict(_BASE, model_type="olmo2"),
    "starcoder2": dict(_BASE, model_type="starcoder2"),
    "gemma3_text": dict(_BASE, model_type="gemma3_text", head_dim=8, tie_word_embeddings=True),
}


def _build(cfg: dict):
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)
    # vision-language models are built with their vision tower
    auto = transformers.AutoModelForImageTextToText if "vision_config" in cfg else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


def _architectures() -> dict[str, dict]:
    seen: dict[str, dict] = {}
    for name, cfg in KNOWN_CONFIGS.items():  # one per type, two layers
        small = dict(cfg)
        small["n_layer" if cfg["model_type"] == "gpt2" else "num_hidden_layers"] = 2
        seen.setdefault(cfg["model_type"], small)
    seen.update({f"tiny:{a}": dict(c) for a, c in TINY_CONFIGS.items()})
    seen.update(TINY_MOE)
    seen.update(DENSE_EXTRA)
    return seen


@pytest.mark.parametrize("cfg", list(TINY_MOE.values()), ids=list(TINY_MOE))
def test_moe_total_equals_transformers(cfg):
    model = _build(cfg)
    spec = spec_from_config(cfg)
    assert spec.total_params() == sum({id(p): p.numel() for p in model.parameters()}.values())


@pytest.mark.parametrize("cfg", list(TINY_MOE.values()), ids=list(TINY_MOE))
def test_moe_active_is_top_k_of_the_routed_experts(cfg):
    """Active = everything but the routed experts a token is not sent to: transformers' count minus
    (E - k)/E of each MoE layer's fused expert tensors."""
    model = _build(cfg)
    spec = spec_from_config(cfg)
    e, k = spec.num_experts, spec.experts_per_token
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    total = sum(p.numel() for p in model.parameters())
    assert spec.active_params() == total - experts * (e - k) // e
    assert spec.active_params() < spec.total_params()


@pytest.mark.parametrize("cfg", list(_architectures().values()), ids=list(_architectures()))
def test_parameter_layout_is_what_transformers_builds(cfg):
    model = _build(cfg)
    spec = spec_from_config(cfg)
    built = {n: p.numel() for n, p in model.named_parameters()}
    layout = parameter_layout(spec)
    total = spec.total_params()
    if "vision_config" in cfg:  # a vision-language model: its language model's parameters, named as built
        built = {n: size for n, size in built.items() if n.startswith((VISION_LANGUAGE_PREFIX, "lm_head."))}
        total -= spec.vision_params()
    assert dict(layout) == built
    assert len(layout) == len(built)  # no duplicate names
    assert sum(n for _, n in layout) == total


def test_dense_layers_follow_each_family_keys():
    qwen = spec_from_config(TINY_MOE["qwen3_moe-sparse-step"])
    assert qwen.dense_layers == (0, 2, 3)  # every 2nd layer counting from 1 routes, layer 3 is MLP-only
    ds = spec_from_config(TINY_MOE["deepseek_v3-mla"])
    assert ds.dense_layers == (0,) and ds.moe_layers == 3
    assert spec_from_config(TINY_MOE["mixtral"]).dense_layers == ()


# Published (total, active) counts, and the tolerance the test allows.
PUBLISHED_MOE = [
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
]


@pytest.mark.parametrize("model_id, total, active", PUBLISHED_MOE)
def test_moe_catalog_matches_published_total_and_active(model_id, total, active):
    spec, _ = resolve_model(model_id)
    assert spec.total_params() == pytest.approx(total, rel=0.01)
    assert spec.active_params() == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("model_id, total, active", [("openai/gpt-oss-20b", 20.91e9, 3.61e9),
                                                      ("openai/gpt-oss-120b", 116.83e9, 5.13e9)])
def test_gpt_oss_matches_its_model_card(model_id, total, active):
    """The gpt-oss card counts active parameters without the input embedding (a lookup)."""
    spec, _ = resolve_model(model_id)
    assert spec.total_params() == pytest.approx(total, rel=0.005)
    assert spec.active_params() - spec.vocab_size * spec.hidden_size == pytest.approx(active, rel=0.005)


def test_training_flops_follow_the_active_parameters():
    mixtral, _ = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    per_token = mixtral.train_flops_per_token(4096)
    matmul = mixtral.active_params() - mixtral.vocab_size * mixtral.hidden_size
    attention = 12 * mixtral.num_layers * 4096 * mixtral.q_dim
    assert per_token == 6 * matmul + attention
    # a dense model of the same total size costs several times more per token
    assert 6 * mixtral.total_params() > 3 * per_token


@pytest.mark.parametrize("cfg", list(_architectures().values()), ids=list(_architectures()))
def test_quantized_weights_are_the_decoder_nn_linears(cfg):
    """bitsandbytes replaces nn.Linear modules (lm_head excepted); transformers 5 builds MoE routers and
    routed experts as plain parameters, so a QLoRA base keeps them in the load dtype."""
    model = _build(cfg)
    spec = spec_from_config(cfg)
    from transformers.pytorch_utils import Conv1D  # GPT-2's linears, which bitsandbytes replaces too

    linear = sum(mod.weight.numel() for name, mod in model.named_modules()
                 if isinstance(mod, (torch.nn.Linear, Conv1D)) and name != "lm_head")
    assert spec.quantized_params() == linear
    if spec.moe_layers:
        assert spec.quantized_params() < spec.linear_params()


def test_plan_output_shows_total_and_active_and_the_compute_from_the_active_count():
    from pathlib import Path

    from recipeforge.config import load_recipe
    from recipeforge.plan import make_plan
    from recipeforge.plan.render import render_plan

    example = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "qwen3-30b-a3b-lora.yaml"
    plan = make_plan(load_recipe(example).recipe)
    text = render_plan(plan)
    assert "30.53B total, 3.35B active" in text
    spec, _ = resolve_model("Qwen/Qwen3-30B-A3B")
    seq, batch = plan.extra.sequence_len, plan.global_batch_size
    weights, attention = spec.flops_terms()
    share = plan.extra.model["trainable_params"] / plan.extra.model["params"]
    per_token = weights * (4 + 2 * share) / 6 + attention * seq  # LoRA: frozen weights get no weight gradient
    assert f"Compute: {per_token / 1e9:.1f} GFLOP per token (active parameters)" in text
    assert f"{per_token * seq * batch / 1e15:.2f} PFLOP per step" in text
    assert per_token < 6 * spec.total_params() / 5  # priced by the active parameters, not the total
