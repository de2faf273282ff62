"""A QLoRA model partitioned for ZeRO-3 before the DeepSpeed engine starts gets the engine's compute dtype
on the parameters the engine converts later (adapters, peft's trainable copies): the engine casts a
model loaded whole (`module.bfloat16()`) but not one already partitioned."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def _peft_model():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    base = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    return peft.get_peft_model(base, lora)  # peft keeps the adapters and the lm_head copy in fp32


@pytest.mark.parametrize(("config", "expected"), [
    ({"bf16": {"enabled": True}, "fp16": {"enabled": False}}, torch.bfloat16),
    ({"bf16": {"enabled": False}, "fp16": {"enabled": True}}, torch.float16),
    ({"bf16": {"enabled": False}, "fp16": {"enabled": False}}, None),
    ({}, None)])
def test_the_engine_dtype_is_read_from_the_deepspeed_config(config, expected):
    from recipeforge.backends.sharded_loading import engine_dtype

    assert engine_dtype(config) == expected


def test_trainable_parameters_take_the_engines_dtype():
    from recipeforge.backends.sharded_loading import in_engine_dtype

    model = _peft_model()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    model.base_model.model.lm_head.modules_to_save["default"].float()  # as after prepare_model_for_kbit_training
    fp32 = sum(1 for p in model.parameters() if p.dtype == torch.float32)
    assert fp32 > 0
    assert in_engine_dtype(model, {"bf16": {"enabled": True}}) == fp32
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == trainable  # still trainable
    assert in_engine_dtype(model, {"bf16": {"enabled": False}}) == 0
