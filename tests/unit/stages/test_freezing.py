"""`train.unfrozen_parameters` on a real (tiny) model, its schema checks, and the torchao check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.param_patterns import parse_pattern
from recipeforge.errors import RecipeError
from recipeforge.stages.freezing import apply_unfrozen_parameters, check_low_bit_optimizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1)
    return transformers.LlamaForCausalLM(config)


def test_axolotl_pattern_semantics():
    p = parse_pattern("model.layers.1.mlp")
    assert p.matches("model.layers.1.mlp.up_proj.weight")  # from the start, not to the end
    assert p.matches("model.layers.10.mlp.up_proj.weight") is False  # `1.` needs the literal dot
    assert not p.matches("model_layers_1_mlp.weight")  # dots are literal
    assert not p.matches("x.model.layers.1.mlp.weight")  # anchored at the start (re.match)
    assert parse_pattern("layers.[0-9]+.mlp").matches("layers.12.mlp.w")  # `.+` keeps its meaning
    assert parse_pattern("^emb.weight$[:100]").rows == (0, 100)
    assert parse_pattern("emb[5]").rows == (5, 6)
    assert parse_pattern("emb[5:]").rows == (5, None)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        parse_pattern("model.(layers")
    with pytest.raises(ValueError, match="empty"):
        parse_pattern("emb[5:3]")


def test_only_selected_parameters_need_gradients():
    model = _model()
    trainable, total = apply_unfrozen_parameters(model, ["model.layers.0.self_attn.q_proj", "^lm_head.weight$"])
    train = {n for n, p in model.named_parameters() if p.requires_grad}
    assert train == {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight"}
    assert trainable == 16 * 16 + 64 * 16 and total == sum(p.numel() for p in model.parameters())


def test_a_row_range_zeroes_the_other_rows_gradients():
    model = _model()
    apply_unfrozen_parameters(model, ["^model.embed_tokens.weight$[10:20]"])
    ids = torch.arange(64).reshape(2, 32)
    model(input_ids=ids, labels=ids).loss.backward()
    grad = model.model.embed_tokens.weight.grad
    assert grad[10:20].abs().sum() > 0
    assert grad[:10].abs().sum() == 0 and grad[20:].abs().sum() == 0


def test_a_pattern_that_selects_nothing_is_located_at_its_index(tmp_path):
    loaded = load_recipe(TINY / "sft-full.yaml",
                         overrides=['train.unfrozen_parameters=["model.layers.0", "model.decoder"]'])
    with pytest.raises(RecipeError) as err:
        apply_unfrozen_parameters(_model(), list(loaded.recipe.train.unfrozen_parameters), locate=loaded.tree.locate)
    (problem,) = err.value.problems
    assert problem.key == "train.unfrozen_parameters[1]" and problem.location is not None
    assert "model.embed_tokens.weight" in problem.hint and "model.layers.0.self_attn.q_proj.weight" in problem.hint


def test_schema_locates_an_invalid_pattern_by_index(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {TINY / 'sft-full.yaml'}\ntrain:\n  unfrozen_parameters:\n"
                      f"    - model.layers.0\n    - model.(layers\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    (problem,) = err.value.problems
    assert problem.key == "train.unfrozen_parameters[1]" and problem.location.line == 5
    assert "not a valid regular expression" in problem.message


def test_schema_refuses_row_ranges_with_weight_decay():
    with pytest.raises(RecipeError, match="without weight decay"):
        load_recipe(TINY / "sft-full.yaml", overrides=["train.weight_decay=0.1",
                                                       'train.unfrozen_parameters=["^model.embed_tokens.weight$[5:]"]'])


def test_missing_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if not installed: find_spec returns None
    with pytest.raises(RecipeError, match=r"needs the torchao package") as err:
        check_low_bit_optimizer("adamw_torchao_4bit")
    assert "recipeforge[torchao]" in err.value.problems[0].hint
    check_low_bit_optimizer("adamw")  # other optimizers need nothing


def test_low_bit_optimizers_use_the_trainers_torchao_route():
    from transformers.training_args import OptimizerNames

    from recipeforge.stages.trainer_args import OPTIMIZERS

    assert OptimizerNames(OPTIMIZERS["adamw_torchao_8bit"]) == OptimizerNames.ADAMW_TORCH_8BIT
    assert OptimizerNames(OPTIMIZERS["adamw_torchao_4bit"]) == OptimizerNames.ADAMW_TORCH_4BIT
