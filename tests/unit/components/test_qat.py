"""`components.qat`: torchao's fake quantization on the layers the int4 export quantizes, swapped back
to plain linear layers before saving; the refusals before anything trains."""

from __future__ import annotations

import pytest

from recipeforge.errors import RecipeError

pytest.importorskip("torchao")


@pytest.fixture
def model():
    import torch

    from recipeforge.components.models import build_tiny_model
    from recipeforge.components.tokenizer import load_tokenizer

    return build_tiny_model("llama", load_tokenizer("tiny:llama"), seed=0, dtype=torch.float32,
                            attn_implementation="sdpa")


@pytest.mark.parametrize("scheme", ["int4_weight", "int8_dynamic_act_int4_weight"])
def test_prepare_fakes_the_decoder_linears_and_strip_restores_plain_ones(model, scheme):
    import torch
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    from recipeforge.components import qat

    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        plain_logits = model(input_ids=ids).logits
    count = qat.prepare(model, scheme, 32)
    assert count == 7 * len(model.model.layers)  # q, k, v, o, gate, up, down
    assert isinstance(model.model.layers[0].self_attn.q_proj, FakeQuantizedLinear)
    assert type(model.lm_head) is torch.nn.Linear and qat.is_prepared(model)
    with torch.no_grad():
        assert not torch.equal(model(input_ids=ids).logits, plain_logits)  # the forward sees rounded weights
    qat.strip(model)
    assert not qat.is_prepared(model)
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_a_group_size_that_does_not_divide_the_widths_is_refused(model):
    from recipeforge.components import qat

    with pytest.raises(RecipeError) as exc:
        qat.check_group_size(model, 256)
    problem = exc.value.problems[0]
    assert problem.key == "train.qat.group_size" and "64, 128" in problem.message and "64, 32, 16" in problem.hint
    qat.check_group_size(model, 64)


def test_missing_torchao_names_the_extra(monkeypatch):
    import importlib.util

    from recipeforge.components import qat

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(RecipeError) as exc:
        qat.check_torchao()
    problem = exc.value.problems[0]
    assert problem.key == "train.qat" and "pip install 'recipeforge[torchao]'" in problem.hint
