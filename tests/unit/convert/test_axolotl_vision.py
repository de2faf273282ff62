"""`recipeforge convert axolotl` on Axolotl's multimodal (vision-language) configs: every config
under tests/data/axolotl/vlm converts and loses nothing, and the rules on configs given as data
(the command as a user runs it on each kind of config: tests/commands/test_axolotl_vision.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import convert_config, convert_file
from recipeforge.config.axolotl.vision import detect, path_restricts, target_names

ROOT = Path(__file__).resolve().parents[3]
VLM = ROOT / "tests" / "data" / "axolotl" / "vlm"
CONFIGS = sorted(VLM.glob("*.yaml"))
MULTIMODAL_KEYS = ("processor_type", "skip_prepare_dataset", "remove_unused_columns", "sample_packing",
                   "chat_template", "image_size", "image_resize_algorithm", "lora_target_modules",
                   "unfrozen_parameters", "freeze_mm_modules", "ddp_find_unused_parameters")
REGEX = r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
LM_NAMES = ["up_proj", "down_proj", "gate_proj", "q_proj", "k_proj", "v_proj", "o_proj"]


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def input_keys(config: dict) -> list[str]:
    keys = list(config)
    for section in ("datasets", "test_datasets"):
        for i, entry in enumerate(config.get(section) or []):
            keys += [f"{section}[{i}].{k}" for k in (entry or {})]
    for section in ("bnb_config_kwargs",):
        keys += [f"{section}.{k}" for k in (config.get(section) or {})]
    return keys


def converted(tmp_path: Path, name: str) -> tuple[dict, str, str]:
    """Run `recipeforge convert axolotl FILE -o OUT` then `recipeforge validate OUT`, as a user types them;
    the recipe as data, its text, and the report printed to stderr."""
    out = tmp_path / f"{Path(name).stem}.recipe.yaml"
    done = cli("convert", "axolotl", f"tests/data/axolotl/vlm/{name}", "-o", str(out))
    assert done.returncode == 0, done.stderr
    checked = cli("validate", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr + out.read_text()
    assert checked.stdout.startswith("ok: ")
    text = out.read_text()
    return yaml.safe_load(text), text, done.stderr


def test_there_are_vlm_configs_of_every_kind():
    names = {p.name for p in CONFIGS}
    assert {"qwen2-vl-lora.yaml", "llama-3.2-vision-qlora.yaml", "gemma3-lora.yaml"} <= names
    for path in CONFIGS:
        assert "processor_type: AutoProcessor" in path.read_text()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_vlm_config_converts_validates_and_loses_nothing(path, tmp_path):
    conv = convert_file(path)
    config = yaml.safe_load(path.read_text())
    assert conv.vision is not None
    lost = [k for k in input_keys(config) if k not in conv.mapped and k not in conv.notes]
    assert not lost, f"keys neither mapped nor reported: {lost}"
    for key in MULTIMODAL_KEYS:  # every multimodal key the config holds is accounted for
        if config.get(key) is not None:
            assert key in conv.mapped or key in conv.notes, key
    out = tmp_path / "recipe.yaml"
    out.write_text(conv.recipe_text())
    recipe = load_recipe(out).recipe
    assert recipe.model.name_or_path == config["base_model"]
    assert recipe.data.packing is False and recipe.data.chat_template == "tokenizer"
    assert all(d.format == "messages" for d in recipe.data.datasets)
    text = out.read_text()
    assert "# A vision-language model (" in text
    for key in conv.notes:
        assert f"#   {key}: " in text


# -- the rules, on configs given as data -----------------------------------------------------------

BASE = {"base_model": "Qwen/Qwen2-VL-2B-Instruct", "processor_type": "AutoProcessor", "sequence_len": 2048,
        "micro_batch_size": 1, "datasets": [{"path": "d.jsonl", "type": "chat_template"}]}


def test_what_makes_a_config_multimodal():
    text = {"base_model": "Qwen/Qwen2.5-7B", "datasets": [{"path": "d", "type": "chat_template"}]}
    assert detect(text) is None
    assert detect({**text, "processor_type": "AutoProcessor"}) == "processor_type is set"
    assert detect({**text, "image_size": 512}) == "image_size is set"
    assert "vision template" in detect({**text, "chat_template": "llama3_2_vision"})
    for name in ("Qwen/Qwen2.5-VL-7B-Instruct", "meta-llama/Llama-3.2-11B-Vision-Instruct",
                 "llava-hf/llava-1.5-7b-hf", "mistralai/Pixtral-12B-2409", "HuggingFaceTB/SmolVLM-Instruct"):
        assert detect({**text, "base_model": name}), name
    # models that also train on text alone are multimodal only by the config's keys
    for name in ("google/gemma-3-4b-it", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "google/gemma-3-1b-it"):
        assert detect({**text, "base_model": name}) is None, name
    assert detect({**text, "lora_target_modules": REGEX}) == "lora_target_modules names parts of a vision-language model"
    # a text config keeps its library template and its packing
    conv = convert_config({**text, "chat_template": "gemma3", "sample_packing": True})
    assert conv.recipe["data"]["chat_template"] == "gemma3" and conv.recipe["data"]["packing"] is True
    assert "vision" not in conv.recipe["model"]


@pytest.mark.parametrize("size, area", [(512, 512 * 512), ([448, 672], 448 * 672), ("384", 384 * 384)])
def test_image_size_bounds_the_area(size, area):
    conv = convert_config({**BASE, "image_size": size})
    vision = conv.recipe["model"]["vision"]
    assert (vision["min_pixels"], vision["max_pixels"]) == (area, area)
    assert conv.mapped["image_size"] == "model.vision.min_pixels, model.vision.max_pixels"
    assert "aspect ratio kept" in conv.notes["image_size"]


def test_an_image_size_that_is_not_one_is_reported():
    conv = convert_config({**BASE, "image_size": [1, 2, 3]})
    assert "min_pixels" not in conv.recipe["model"]["vision"] and "not converted" in conv.notes["image_size"]
    conv = convert_config({**BASE, "image_size": 0})
    assert "min_pixels" not in conv.recipe["model"]["vision"] and "not a size" in conv.notes["image_size"]


def test_lora_patterns_decide_the_tower_and_projector():
    def vision(**extra):
        conv = convert_config({**BASE, "adapter": "lora", **extra})
        return conv, conv.recipe["model"]["vision"]

    conv, v = vision(lora_target_modules=REGEX)
    assert (v["train_tower"], v["train_projector"]) == (False, False)
    assert conv.recipe["adapter"]["target_modules"] == LM_NAMES
    conv, v = vision(lora_target_modules=r"model.(visual|language_model).*\.(qkv|q_proj|v_proj)")
    assert (v["train_tower"], v["train_projector"]) == (True, False)
    assert "names the vision tower" in conv.notes["lora_target_modules"]
    conv, v = vision(lora_target_modules=r"model.(multi_modal_projector|language_model.layers.[\d]+.self_attn)"
                                         r".(q_proj|v_proj|linear_1|linear_2)")
    assert (v["train_tower"], v["train_projector"]) == (False, True)
    conv, v = vision(lora_target_modules=["q_proj", "v_proj"])
    assert (v["train_tower"], v["train_projector"]) == (False, False)
    assert "names without a path" in conv.notes["lora_target_modules"]
    conv, v = vision(lora_target_linear=True)
    assert (v["train_tower"], v["train_projector"]) == (True, True)
    assert conv.recipe["adapter"]["target_modules"] == "all-linear" and "lora_target_linear" in conv.notes
    conv, v = vision(lora_target_linear=True, freeze_mm_modules=True)
    assert (v["train_tower"], v["train_projector"]) == (False, False) and "freeze_mm_modules" in conv.notes
    conv = convert_config({**BASE, "adapter": "lora", "unfrozen_parameters": ["^model.visual.merger.*"]})
    assert "train_projector" in conv.notes["unfrozen_parameters"]


def test_full_fine_tunes_train_what_axolotl_trains():
    conv = convert_config(BASE)  # no adapter, nothing frozen: Axolotl trains every weight
    assert conv.recipe["model"]["vision"] == {"train_tower": True, "train_projector": True}
    assert "trains every weight" in conv.notes["base_model"]
    conv = convert_config({**BASE, "freeze_mm_modules": True})
    assert conv.recipe["model"]["vision"] == {"train_tower": False, "train_projector": False}
    assert conv.mapped["freeze_mm_modules"].startswith("model.vision.train_tower")
    conv = convert_config({**BASE, "unfrozen_parameters": ["^model.visual.blocks.3[0-1].*", "^model.visual.merger.*"]})
    assert conv.recipe["model"]["vision"] == {"train_tower": True, "train_projector": True}
    conv = convert_config({**BASE, "unfrozen_parameters": ["^model.visual.merger.*"]})
    assert conv.recipe["model"]["vision"] == {"train_tower": False, "train_projector": True}
    conv = convert_config({**BASE, "unfrozen_parameters": ["^model.language_model.*"]})
    assert conv.recipe["model"]["vision"] == {"train_tower": False, "train_projector": False}
    assert conv.recipe["train"]["unfrozen_parameters"] == ["^model.language_model.*"]


def test_packing_and_templates_of_a_vlm_config():
    conv = convert_config({**BASE, "sample_packing": True, "chat_template": "qwen2_vl",
                           "datasets": [{"path": "d.jsonl", "type": "chat_template", "chat_template": "chatml"}]})
    assert conv.recipe["data"]["packing"] is False and "refused for image data" in conv.notes["sample_packing"]
    assert conv.recipe["data"]["chat_template"] == "tokenizer"
    assert "processor's own chat template" in conv.notes["datasets[0].chat_template"]
    conv = convert_config({**BASE, "chat_template": "tokenizer_default"})
    assert conv.recipe["data"]["chat_template"] == "tokenizer" and "chat_template" not in conv.notes
    conv = convert_config({**BASE, "chat_template": "jinja", "chat_template_jinja": "vl.jinja"})
    assert conv.recipe["data"]["chat_template"] == "vl.jinja"  # a template of the user's own is kept


def test_image_columns_are_reported():
    conv = convert_config({**BASE, "datasets": [{"path": "d.jsonl", "type": "chat_template", "field_images": "imgs",
                                                 "image_root": "/data/coco"},
                                                {"path": "e.jsonl", "type": "chat_template", "field_image": "image"}]})
    assert "rename the image column to `images`" in conv.notes["datasets[0].field_images"]
    assert "with it in front" in conv.notes["datasets[0].image_root"]
    assert "by that name already" in conv.notes["datasets[1].field_image"]
    assert "{type: image, image: <path>}" in conv.notes["datasets"]
    assert "field_images" not in str(conv.recipe["data"]["datasets"])


def test_processor_and_model_class_keys_are_handled():
    conv = convert_config({**BASE, "processor_type": "Qwen2VLProcessor", "processor_config": "my/processor",
                           "model_type": "Qwen2VLForConditionalGeneration", "remove_unused_columns": False,
                           "skip_prepare_dataset": True, "image_resize_algorithm": "lanczos"})
    assert "'Qwen2VLProcessor' is not used" in conv.notes["processor_type"]
    assert "AutoModelForImageTextToText" in conv.notes["model_type"]
    assert "model.name_or_path" in conv.notes["processor_config"]
    assert conv.notes["remove_unused_columns"].startswith("not needed")
    assert "processor's own filter" in conv.notes["image_resize_algorithm"]
    # on a text model these keys are reported too (never dropped)
    text = convert_config({"base_model": "Qwen/Qwen2.5-7B", "datasets": [{"path": "d", "type": "alpaca"}],
                           "skip_prepare_dataset": True, "remove_unused_columns": False})
    assert {"skip_prepare_dataset", "remove_unused_columns"} <= set(text.notes)


@pytest.mark.parametrize("pattern, names, restricts", [
    (REGEX, LM_NAMES, False),
    (r"language_model.model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj", LM_NAMES, False),
    (r".*\.(q_proj|v_proj)$", ["q_proj", "v_proj"], False),
    (r"^.*(?:q|k)_proj$", ["q_proj", "k_proj"], False),
    (r"model.layers.(0|1).self_attn.(q|v)_proj", ["q_proj", "v_proj"], True),
    (r".*_proj", None, None),
    (r"model.layers.[\d]+.mlp.[a-z]+_proj", None, None),
])
def test_target_module_regexes_as_names(pattern, names, restricts):
    found = target_names(pattern)
    if names is None:
        assert found is None
        return
    assert found[0] == names and path_restricts(found[1]) is restricts


def test_a_regex_that_is_not_names_is_kept_and_reported_as_before():
    conv = convert_config({**BASE, "adapter": "lora", "lora_target_modules": r".*_proj"})
    assert conv.recipe["adapter"]["target_modules"] == [".*_proj"]
    assert "replace it with the names" in conv.notes["lora_target_modules"]
    conv = convert_config({"base_model": "Qwen/Qwen2.5-7B", "datasets": [{"path": "d", "type": "alpaca"}],
                           "adapter": "lora", "lora_target_modules": r"model.layers.(0|1).self_attn.(q|v)_proj"})
    assert conv.recipe["adapter"]["target_modules"] == ["q_proj", "v_proj"]
    assert "every module of those names gets an adapter" in conv.notes["lora_target_modules"]
    assert "vision" not in conv.recipe["model"]
