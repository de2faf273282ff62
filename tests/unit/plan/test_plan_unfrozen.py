"""`train.unfrozen_parameters` in the planner: the trainable count from the config's parameter names
equals what freezing the real model leaves trainable, and only those parameters get gradients and
optimizer states."""

from __future__ import annotations

import pytest

from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.unfrozen import unfrozen_count

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = [
    (dict(model_type="llama", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
     ["model.layers.1.", "^lm_head.weight$", r"model.layers.\d+.self_attn.q_proj"]),
    (dict(model_type="qwen3_moe", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=16, tie_word_embeddings=False),
     ["model.layers.[0-9]+.mlp.gate", "model.embed_tokens"]),  # routers only (gate.weight), and embeddings
    (dict(model_type="gpt2", vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64),
     ["transformer.h.1.mlp", "transformer.wte$"]),  # `transformer.wte$` selects nothing on its own ...
]


def _meta_model(cfg):
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(cfg["model_type"],
                                                                                              **kwargs))


@pytest.mark.parametrize("cfg, patterns", CASES[:2], ids=["llama", "qwen3_moe"])
def test_planned_trainable_count_equals_the_real_models(cfg, patterns):
    from recipeforge.stages.freezing import apply_unfrozen_parameters

    model = _meta_model(cfg)
    trainable, total = apply_unfrozen_parameters(model, patterns)
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    planned, notes = unfrozen_count(spec_from_config(cfg), patterns)
    assert planned == trainable and 0 < planned < total
    assert any("parameter tensors train" in n for n in notes)


def test_a_pattern_that_selects_nothing_is_a_located_error_with_real_names():
    cfg, patterns = CASES[2]
    with pytest.raises(RecipeError) as err:
        unfrozen_count(spec_from_config(cfg), patterns)
    (problem,) = err.value.problems
    assert problem.key == "train.unfrozen_parameters[1]"
    assert "transformer.wte.weight" in problem.hint  # matched from the start: `wte$` needs `.weight`


def test_plan_sizes_gradients_and_optimizer_for_the_selected_parameters(recipe):
    cpu = parse_hardware("cpu")
    full = make_plan(recipe("tiny:llama"), cpu)
    part = make_plan(recipe("tiny:llama", train={"unfrozen_parameters": ["model.layers.1.mlp"]}), cpu)
    total = full.extra.model["params"]
    trainable = part.extra.model["trainable_params"]
    assert trainable == 3 * 64 * 128 and full.extra.model["trainable_params"] == total
    # weights whole, gradients and AdamW states (fp32 on the CPU) for the selected share only
    assert part.memory_gb["weights"] == full.memory_gb["weights"]
    assert part.memory_gb["optimizer"] == pytest.approx(full.memory_gb["optimizer"] * trainable / total, abs=0.01)
    assert any("parameter tensors train" in w for w in part.extra.warnings)


def test_unfrozen_parameters_with_an_adapter_are_refused(recipe):
    r = recipe("tiny:llama", adapter={"type": "lora"}, train={"unfrozen_parameters": ["model.layers.1"]})
    with pytest.raises(RecipeError, match="adapter.type lora freezes") as err:
        make_plan(r, parse_hardware("cpu"))
    assert err.value.problems[0].key == "train.unfrozen_parameters"


def test_mixtral_routers_only_is_a_tiny_share_of_the_plan():
    spec = spec_from_config(dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                 num_local_experts=8, num_experts_per_tok=2))
    routers, _ = unfrozen_count(spec, [r"model.layers.\d+.mlp.gate.weight$"])
    assert routers == 32 * 8 * 4096
