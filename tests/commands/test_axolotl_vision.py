"""`recipeforge convert axolotl` on Axolotl's multimodal configs, run as a user types it: the configs
under tests/data/axolotl/vlm convert, the recipes validate, `model.vision` says which parts train and
how images are sized (the rules on configs given as data: tests/unit/convert/test_axolotl_vision.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LM_NAMES = ["up_proj", "down_proj", "gate_proj", "q_proj", "k_proj", "v_proj", "o_proj"]


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


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


def test_qwen2_vl_lora(tmp_path):
    recipe, text, report = converted(tmp_path, "qwen2-vl-lora.yaml")
    vision = recipe["model"]["vision"]
    assert vision == {"train_tower": False, "train_projector": False, "min_pixels": 448 * 448,
                      "max_pixels": 448 * 448}
    # the regex that keeps LoRA off the vision tower becomes the names it ends in
    assert recipe["adapter"]["type"] == "lora" and recipe["adapter"]["target_modules"] == LM_NAMES
    assert (recipe["data"]["packing"], recipe["data"]["chat_template"]) == (False, "tokenizer")
    assert recipe["data"]["datasets"][1]["columns"] == {"messages": "conversations"}
    assert "A vision-language model (processor_type is set)" in report
    assert "'qwen2_vl': for a vision-language model the processor's own chat template" in report
    assert "its path keeps them on the language model" in report
    assert "image_size: Axolotl resizes every image to exactly 448x448; recipeforge bounds the image area" in report
    assert "image_resize_algorithm: 'bilinear' has no counterpart" in report
    assert "datasets[1].field_images: 'pictures'" in report and "`images`" in report
    for key in ("processor_type", "skip_prepare_dataset", "remove_unused_columns"):
        assert f"  {key}: not needed" in report, key
    assert "sample_packing: packing is refused" not in report  # false in the config: mapped, not reported
    assert "#   image_size: Axolotl resizes" in text


def test_llama_3_2_vision_qlora(tmp_path):
    recipe, _, report = converted(tmp_path, "llama-3.2-vision-qlora.yaml")
    assert recipe["model"]["vision"] == {"train_tower": False, "train_projector": False, "min_pixels": 560 * 560,
                                         "max_pixels": 560 * 560}
    a = recipe["adapter"]
    assert (a["type"], a["quant"]["bits"], a["quant"]["quant_type"], a["target_modules"]) == (
        "qlora", 4, "nf4", LM_NAMES)
    # sample_packing: true in the config: packing is refused for image data, so the recipe turns it off
    assert recipe["data"]["packing"] is False
    assert "sample_packing: packing is refused for image data" in report
    assert "'llama3_2_vision': for a vision-language model" in report
    assert "560x560 = 313600" in report


def test_gemma3_lora(tmp_path):
    recipe, _, report = converted(tmp_path, "gemma3-lora.yaml")
    # gemma3 is a text template too: a vision config uses the processor's template all the same
    assert recipe["data"]["chat_template"] == "tokenizer" and "'gemma3': for a vision-language model" in report
    assert recipe["model"]["vision"] == {"train_tower": False, "train_projector": False}
    assert recipe["model"]["eot_tokens"] == ["<end_of_turn>"] and recipe["adapter"]["target_modules"] == LM_NAMES
    assert "ddp_find_unused_parameters: not needed" in report
    assert "image_size" not in report


def test_llava_full_fine_tune_trains_the_projector(tmp_path):
    recipe, _, report = converted(tmp_path, "llava-full-projector.yaml")
    assert recipe["model"]["vision"]["train_tower"] is False and recipe["model"]["vision"]["train_projector"] is True
    assert recipe["train"]["unfrozen_parameters"][0] == "^model.multi_modal_projector.*"
    assert "adapter" not in recipe and recipe["data"]["chat_template"] == "tokenizer"
    assert "the projector trains (train_projector: true)" in report
