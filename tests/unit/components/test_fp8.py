"""`components.fp8`: which linear layers convert (the rule the planner reports), torchao's conversion
on the CPU (no training: float8 matmuls need a GPU), the swap back to plain layers, and the device check."""

from __future__ import annotations

import pytest

from recipeforge.components import fp8
from recipeforge.errors import RecipeError


def _llama(intermediate: int = 136):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    return transformers.LlamaForCausalLM(config)


def test_the_rule_skips_the_head_and_dims_not_multiples_of_16():
    assert fp8.eligible(4096, 14336)
    assert not fp8.eligible(4096, 14336, is_head=True)
    assert not fp8.eligible(64, 136) and not fp8.eligible(136, 64)


def test_conversion_swaps_the_eligible_layers_and_strip_restores_plain_weights(tmp_path):
    import torch
    import transformers
    from torchao.float8.float8_linear import Float8Linear

    model = _llama()  # MLP width 136: not a multiple of 16, so the MLP stays bf16
    names = fp8.convert(model, "tensorwise", all_gather=True)
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == set(names)
    assert not isinstance(model.lm_head, Float8Linear) and not isinstance(model.model.layers[0].mlp.up_proj, Float8Linear)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert fp8.strip(model) == len(names) and not fp8.is_converted(model)
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert type(weight) is torch.nn.Parameter
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert set(loaded.state_dict()) == set(before)
    assert torch.equal(loaded.model.layers[1].self_attn.o_proj.weight, before["model.layers.1.self_attn.o_proj.weight"])


def test_every_linear_converts_when_the_dims_allow_it():
    model = _llama(intermediate=128)
    assert len(fp8.converted_names(model)) == 2 * 7


def test_float8_all_gather_is_tensorwise_only():
    assert fp8.float8_config("tensorwise", True).enable_fsdp_float8_all_gather
    assert not fp8.float8_config("tensorwise", False).enable_fsdp_float8_all_gather
    rowwise = fp8.float8_config("rowwise", True)
    assert not rowwise.enable_fsdp_float8_all_gather and rowwise.round_scales_to_power_of_2


@pytest.mark.parametrize("device,capability,name,says", [
    ("cpu", None, None, "no CUDA GPU"), ("cuda", (8, 0), "NVIDIA A100-SXM4-80GB", "A100"),
    ("cuda", (7, 0), "Tesla V100", "7.0")])
def test_devices_without_float8_tensor_cores_are_refused(device, capability, name, says):
    with pytest.raises(RecipeError) as err:
        fp8.check_device(device, capability, name)
    assert err.value.problems[0].key == "train.precision" and says in str(err.value)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_ada_hopper_and_blackwell_pass(capability):
    fp8.check_device("cuda", capability, "GPU")
