"""The planner sizes vision-language models: the vision tower and projector from config.json, what
trains, tokens per image, and the vision activation term."""

from __future__ import annotations

import json

import pytest

from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.catalog import KNOWN_CONFIGS, resolve_model
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import estimate
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.vision import QWEN_MAX_PIXELS
from recipeforge.plan.workload import build_workload
from recipeforge.plan.planners import Planners
from recipeforge.config.schema import recipe_adapter
from plan_testing import bound_layout

QWEN_VL = "Qwen/Qwen2.5-VL-7B-Instruct"
H100 = parse_hardware("1xH100-80GB")
SINGLE = bound_layout("single")


def build_recipe(model_name: str, **sections):
    """A validated SFT recipe for `model_name`; keyword arguments are top-level sections."""
    data = {"datasets": [{"path": "data.jsonl", "format": "messages"}], **sections.pop("data", {})}
    raw = {"stage": "sft", "model": {"name_or_path": model_name, **sections.pop("model", {})}, "data": data, **sections}
    return recipe_adapter().validate_python(raw)


def _workload(model=QWEN_VL, vision=None, adapter=None, seq=4096):
    r = build_recipe(model, model={"dtype": "bf16", "vision": vision or {}},
                     adapter=adapter or {"type": "lora", "r": 16, "target_modules": "all-linear"},
                     data={"sequence_len": seq})
    spec, _ = resolve_model(model, allow_hub=False)
    return build_workload(r, spec, H100, Planners.installed())


def test_qwen25_vl_7b_counts_the_published_total():
    spec, source = resolve_model(QWEN_VL, allow_hub=False)
    assert "built-in table" in source
    # 8,292,166,656: the sum of the published safetensors index (7.62B language model + 676.6M vision)
    assert spec.total_params() == 8_292_166_656
    assert spec.text_params() == resolve_model("Qwen/Qwen2.5-7B", allow_hub=False)[0].total_params()
    assert spec.vision.tower_params + spec.vision.projector_params == 676_550_144
    assert spec.model_type == "qwen2_5_vl" and spec.decoder_layer_class == "Qwen2_5_VLDecoderLayer"
    assert not any("text_config" in n or "Llama-style" in n for n in spec.notes)


def test_flat_qwen25_vl_config_in_a_local_directory(tmp_path):
    """The published layout: text fields at the top, vision_config next to them."""
    cfg = dict(KNOWN_CONFIGS[QWEN_VL], architectures=["Qwen2_5_VLForConditionalGeneration"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec, source = resolve_model(str(tmp_path))
    assert source.endswith("config.json")
    assert spec.vision is not None and spec.vision.family == "qwen2_5_vl"
    assert spec.total_params() == 8_292_166_656
    assert spec.vision.depth == 32 and spec.vision.hidden_size == 1280 and spec.vision.merge == 2


def test_nested_config_reads_text_and_vision_the_same(tmp_path):
    flat = dict(KNOWN_CONFIGS[QWEN_VL])
    vision = flat.pop("vision_config")
    text = dict(flat, model_type="qwen2_5_vl_text")
    nested = {"model_type": "qwen2_5_vl", "text_config": text, "vision_config": vision}
    assert spec_from_config(nested).total_params() == spec_from_config(KNOWN_CONFIGS[QWEN_VL]).total_params()


def test_tokens_per_image_at_the_processor_default_and_at_max_pixels():
    spec = spec_from_config(KNOWN_CONFIGS[QWEN_VL])
    image = spec.vision.image_tokens()
    assert image.requested_pixels == QWEN_MAX_PIXELS == 1003520
    assert (image.patches, image.llm_tokens) == (5120, 1280)
    smaller = spec.vision.image_tokens(512 * 512)
    assert smaller.llm_tokens == 512 * 512 // (28 * 28) and smaller.patches == 4 * smaller.llm_tokens


def test_train_tower_adds_the_tower_to_gradients_and_optimizer():
    """Full fine-tuning: the tower's gradients and AdamW states appear only when it trains, by its size."""
    full = {"type": "none"}
    frozen = _workload(vision={"train_tower": False}, adapter=full)
    trained = _workload(vision={"train_tower": True}, adapter=full)
    tower = frozen.model.vision.tower_params
    assert trained.trainable_params() - frozen.trainable_params() == tower
    a, b = estimate(frozen, SINGLE, 1, True), estimate(trained, SINGLE, 1, True)
    # one GPU, pure bf16: 2-byte gradients, two 2-byte AdamW states; the weights are the same
    assert b.components["weights"] == a.components["weights"]
    assert b.components["gradients"] - a.components["gradients"] == pytest.approx(2 * tower)
    assert b.components["optimizer"] - a.components["optimizer"] == pytest.approx(4 * tower)


def test_lora_on_the_tower_only_when_it_trains():
    frozen = _workload(vision={"train_tower": False})
    trained = _workload(vision={"train_tower": True})
    assert frozen.vision.tower_lora == () and trained.vision.tower_lora
    v = trained.model.vision
    per_layer = sum(16 * (lin.in_features + lin.out_features) for lin in v.layer_linears)
    assert trained.trainable_params() - frozen.trainable_params() == v.depth * per_layer


def test_a_frozen_vision_side_keeps_no_activations():
    w = _workload(vision={"train_tower": False, "train_projector": False})
    assert estimate(w, SINGLE, 1, True).components["vision_activations"] == 0


def test_images_per_sample_scales_the_vision_activation_term():
    one = _workload(vision={"train_tower": True, "images_per_sample": 1}, seq=8192)
    three = _workload(vision={"train_tower": True, "images_per_sample": 3}, seq=8192)
    a = estimate(one, SINGLE, 1, True).components["vision_activations"]
    b = estimate(three, SINGLE, 1, True).components["vision_activations"]
    assert a > 0 and b == pytest.approx(3 * a)


def test_max_pixels_scales_the_vision_activation_term():
    big = _workload(vision={"train_tower": True, "max_pixels": 28 * 28 * 1024})
    small = _workload(vision={"train_tower": True, "max_pixels": 28 * 28 * 256})
    assert estimate(big, SINGLE, 1, False).components["vision_activations"] == pytest.approx(
        4 * estimate(small, SINGLE, 1, False).components["vision_activations"])


def test_checkpointing_keeps_only_the_vit_layer_inputs():
    w = _workload(vision={"train_tower": True})
    v = w.model.vision
    ckpt = estimate(w, SINGLE, 1, True).components["vision_activations"]
    full = estimate(w, SINGLE, 1, False).components["vision_activations"]
    tower_inputs = 5120 * v.depth * 2 * v.hidden_size  # patches x layers x bf16 hidden
    assert tower_inputs < ckpt < full


def test_plan_carries_the_vision_fields_and_sequence_assumption():
    r = build_recipe(QWEN_VL, model={"dtype": "bf16", "vision": {"train_projector": True}},
                     adapter={"type": "lora", "r": 16, "target_modules": "all-linear"}, data={"sequence_len": 4096},
                     train={"micro_batch_size": 1, "global_batch_size": 8})
    plan = make_plan(r, H100)
    v = plan.to_dict()["extra"]["vision"]
    assert v["patches_per_image"] == 5120 and v["llm_tokens_per_image"] == 1280
    assert v["train_tower"] is False and v["train_projector"] is True and v["projector_adapters"] is True
    assert v["activation_bytes_per_image"]["tower"] == 0 and v["activation_bytes_per_image"]["projector"] > 0
    assert "data.sequence_len bounds text and image tokens" in v["assumption"]
    assert plan.memory_gb["vision_activations"] == pytest.approx(v["activations_gb"], abs=0.01)
    assert plan.extra.accuracy_class == "uncalibrated"


@pytest.mark.parametrize("recipe, override, key, words", [
    ("sft-lora", "data.packing=true", "data.packing", "packing is not possible with images"),
    ("kto", None, "stage", "stage kto cannot train the vision-language model"),
    ("grpo", None, "stage", "rollout engines and reward functions take text prompts only"),
])
def test_what_a_vision_model_cannot_train_is_refused_by_the_plan(recipe, override, key, words):
    """Known from config.json alone: refused at `plan` (and so at `train` before anything loads)."""
    from pathlib import Path

    from recipeforge.config import load_recipe
    from recipeforge.errors import RecipeError

    tiny = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"
    overrides = [f"model.name_or_path={QWEN_VL}", "model.dtype=bf16", *([override] if override else [])]
    r = load_recipe(tiny / f"{recipe}.yaml", overrides=overrides).recipe
    with pytest.raises(RecipeError, match=words) as info:
        make_plan(r, H100)
    assert info.value.problems[0].key == key


def test_images_filling_the_sequence_are_warned_about():
    w = _workload(vision={"images_per_sample": 4}, seq=4096)
    assert any("fill the whole 4096-token sequence" in n for n in w.notes)


def test_text_only_models_have_no_vision_side():
    spec, _ = resolve_model("meta-llama/Llama-3.1-8B", allow_hub=False)
    assert spec.vision is None and spec.total_params() == spec.text_params()
    w = _workload("meta-llama/Llama-3.1-8B", vision={"train_tower": True, "images_per_sample": 4})
    assert w.vision is None
    mem = estimate(w, SINGLE, 1, True)
    assert mem.components["vision_activations"] == 0


@pytest.mark.parametrize("config, family, llm_tokens, patches", [
    ({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                             "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32064},
      "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                        "num_hidden_layers": 24, "image_size": 336, "patch_size": 14}}, "llava", 576, 577),
    ({"model_type": "gemma3", "mm_tokens_per_image": 256,
      "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                      "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                      "vocab_size": 262208},
      "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                        "image_size": 896, "patch_size": 14, "vision_use_head": False}}, "gemma3", 256, 4096),
    ({"model_type": "mllama",
      "text_config": {"model_type": "mllama_text_model", "hidden_size": 4096, "intermediate_size": 14336,
                      "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                      "vocab_size": 128256, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
      "vision_config": {"hidden_size": 1280, "num_hidden_layers": 32, "num_global_layers": 8, "image_size": 560,
                        "patch_size": 14, "max_num_tiles": 4, "vision_output_dim": 7680}}, "mllama", 1, 4 * 1608),
])
def test_other_families_tokens_per_image(config, family, llm_tokens, patches):
    spec = spec_from_config(config)
    image = spec.vision.image_tokens()
    assert spec.vision.family == family
    assert (image.llm_tokens, image.patches) == (llm_tokens, patches)
    if family == "mllama":
        assert not spec.vision.in_sequence and any("approximate" in n for n in spec.notes)


def test_published_llama32_vision_11b_is_about_its_size():
    """Mllama is approximate; Llama-3.2-11B-Vision is published as 10.7B parameters."""
    cfg = {"model_type": "mllama",
           "text_config": {"model_type": "mllama_text_model", "hidden_size": 4096, "intermediate_size": 14336,
                           "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                           "vocab_size": 128256, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
           "vision_config": {"hidden_size": 1280, "num_hidden_layers": 32, "num_global_layers": 8,
                             "image_size": 560, "patch_size": 14, "max_num_tiles": 4, "vision_output_dim": 7680,
                             "intermediate_size": 5120, "attention_heads": 16}}
    assert spec_from_config(cfg).total_params() == pytest.approx(10.67e9, rel=0.01)


def test_an_unknown_vision_tower_is_said_not_sized():
    text = dict(KNOWN_CONFIGS["Qwen/Qwen2.5-7B"])
    spec = spec_from_config({"model_type": "some_vlm", "text_config": text, "vision_config": {"hidden_size": 8}})
    assert spec.vision is None and any("vision tower is not sized" in n for n in spec.notes)


def test_vision_activation_bytes_are_gib_scale_for_a_trained_qwen_tower():
    """A sanity bound: 5120 patches x 32 layers at width 1280 keep a few GiB without recomputation."""
    w = _workload(vision={"train_tower": True}, adapter={"type": "none"})
    gib = estimate(w, SINGLE, 1, False).components["vision_activations"] / GIB
    assert 5 < gib < 15


# Small configs of each family (two text layers, a short tower): the count must equal the parameters
# transformers builds for the whole model on the meta device; Mllama differs by what its note says.
_BUILT = {
    "qwen2_vl": {"text_config": {"num_hidden_layers": 2}, "vision_config": {"depth": 2}},
    "qwen2_5_vl": {"text_config": {"num_hidden_layers": 2, "hidden_size": 3584, "intermediate_size": 18944,
                                   "num_attention_heads": 28, "num_key_value_heads": 4},
                   "vision_config": {"depth": 2, "hidden_size": 1280, "out_hidden_size": 3584}},
    "qwen3_vl": {"text_config": {"num_hidden_layers": 2}, "vision_config": {"depth": 2}},
    "llava-clip": {"text_config": {"model_type": "llama", "num_hidden_layers": 2},
                   "vision_config": {"model_type": "clip_vision_model", "num_hidden_layers": 2}},
    "llava-siglip": {"text_config": {"model_type": "llama", "num_hidden_layers": 2},
                     "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 2}},
    "gemma3": {"text_config": {"num_hidden_layers": 2}, "vision_config": {"num_hidden_layers": 2}},
    "mllama": {"text_config": {"num_hidden_layers": 4, "cross_attention_layers": [1, 3]},
               "vision_config": {"num_hidden_layers": 2, "num_global_layers": 1}},
}


@pytest.mark.parametrize("name", list(_BUILT))
def test_vision_counts_equal_what_transformers_builds(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(name.split("-")[0], **_BUILT[name])
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    built = sum({id(p): p.numel() for p in model.parameters()}.values())
    spec = spec_from_config(config.to_dict())
    vision = sum(p.numel() for n, p in model.named_parameters()
                 if n.startswith(("model.visual", "model.vision_tower", "model.vision_model",
                                  "model.multi_modal_projector")))
    assert spec.vision_params() == vision
    # the class FSDP wraps each vision layer by is the one transformers builds them with, once per layer
    blocks = [m for m in model.modules() if type(m).__name__ == spec.vision.block_class]
    assert len(blocks) == spec.vision.depth
    if name == "mllama":  # 8 extra embedding rows, and the cross-attention layers' q/k norms and gates
        text = config.text_config
        extra = 8 * text.hidden_size + 2 * (2 * (text.hidden_size // text.num_attention_heads) + 2)
        assert built - spec.total_params() == extra
    else:
        assert spec.total_params() == built


def test_fsdp_wraps_the_vision_layers_as_units_too():
    # The memory model shards the tower layer by layer; FSDP must wrap those layers for that to hold.
    from recipeforge.backends.artifacts import fsdp_plugin_config

    r = build_recipe(QWEN_VL, model={"dtype": "bf16"}, distributed={"backend": "fsdp"})
    plan = make_plan(r, parse_hardware("8xH100-80GB"))
    assert plan.extra.model["vision_block_class"] == "Qwen2_5_VLVisionBlock"
    wrapped = fsdp_plugin_config(plan, r)["transformer_cls_names_to_wrap"]
    assert wrapped == [plan.extra.model["decoder_layer_class"], "Qwen2_5_VLVisionBlock"]
    text = build_recipe("meta-llama/Llama-3.1-8B", model={"dtype": "bf16"}, distributed={"backend": "fsdp"})
    assert fsdp_plugin_config(make_plan(text, parse_hardware("8xH100-80GB")), text)[
        "transformer_cls_names_to_wrap"] == ["LlamaDecoderLayer"]
