"""`recipeforge convert axolotl` of the knowledge-distillation plugin (axolotl.integrations.kd, Axolotl
0.19.0): an online teacher server becomes a served teacher, the loss keys the `distill:` section, and
precomputed teacher log-probs are reported with an empty teacher that validation stops at."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import convert_config, convert_file
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.world import plan_for_world

ROOT = Path(__file__).resolve().parents[3]
ONLINE = ROOT / "tests" / "data" / "axolotl" / "kd-online-vllm.yaml"
PRECOMPUTED = ROOT / "tests" / "data" / "axolotl" / "kd" / "kd-precomputed-logprobs.yaml"


def write(conv, tmp_path: Path) -> Path:
    out = tmp_path / "recipe.yaml"
    out.write_text(conv.recipe_text())
    return out


def test_an_online_teacher_becomes_a_served_teacher_and_the_loss_keys_distill(tmp_path):
    conv = convert_file(ONLINE, world_size=8)
    r = load_recipe(write(conv, tmp_path)).recipe
    d = r.distill
    assert r.stage == "distill" and conv.mapped["kd_trainer"] == "stage"
    assert (d.teacher.url, d.teacher.name_or_path, d.teacher.timeout_s) == ("http://10.0.0.12:8000/v1", None, 300.0)
    assert (d.top_k, d.temperature, d.loss, d.sft_weight) == (64, 1.0, "forward_kl", pytest.approx(0.1))
    assert "/v1 is added" in conv.notes["kd_online_server_base_url"]
    assert "kd_ce_alpha / (kd_ce_alpha + kd_alpha) = 0.1 / (0.1 + 0.9) = 0.1" in conv.notes["kd_ce_alpha"]
    assert "kd_alpha" in conv.mapped and "kd_online_server" in conv.mapped
    # what has no counterpart is reported with its reason
    assert "rest of the vocabulary as one more bucket" in conv.notes["kd_normalize_topk"]
    assert "no temperature schedule" in conv.notes["kd_temperature_min"]
    assert "LigerPlugin" in conv.notes["plugins"] and "KDPlugin" not in conv.notes["plugins"]
    assert r.data.datasets[0].format == "messages"
    plan = plan_for_world(r, hardware=parse_hardware("8xH100-80GB"))
    assert plan.reasons["teacher"].value == "served" and "teacher_model" not in plan.memory_gb


def test_precomputed_logprobs_leave_the_teacher_to_name_and_validation_stops_there(tmp_path):
    conv = convert_file(PRECOMPUTED)
    assert conv.recipe["stage"] == "distill" and conv.recipe["distill"]["teacher"] == {}
    assert "column 'llm_text_generation_vllm_logprobs'" in conv.notes["datasets[0].type"]
    assert "is not read" in conv.notes["datasets[0].type"]
    assert "name the teacher that produced them" in conv.notes["kd_trainer"]
    assert "datasets[0].temperature" in conv.notes and "datasets[0].logprobs_field" in conv.mapped
    text = conv.recipe_text()
    assert "#   kd_trainer: Axolotl distills from log-probs precomputed" in text  # the report heads the recipe
    recipe = yaml.safe_load(text)
    assert recipe["distill"] == {"teacher": {}, "temperature": 1.0, "sft_weight": 0.1, "loss": "jsd", "beta": 0.5}
    assert recipe["data"]["datasets"][0]["format"] == "messages"
    assert recipe["data"]["datasets"][0]["columns"] == {"messages": "messages_combined"}
    with pytest.raises(RecipeError) as err:
        load_recipe(write(conv, tmp_path))
    problem = err.value.problems[0]
    assert problem.key == "distill.teacher" and "either `name_or_path`" in problem.message
    # once the user names the teacher that produced the log-probs, it validates
    fixed = text.replace("teacher: {}", "teacher: {name_or_path: Qwen/Qwen3-8B}")
    out = tmp_path / "fixed.yaml"
    out.write_text(fixed)
    assert load_recipe(out).recipe.distill.teacher.name_or_path == "Qwen/Qwen3-8B"


BASE = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "rows.jsonl", "type": "chat_template"}],
        "sequence_len": 1024, "micro_batch_size": 1, "gradient_accumulation_steps": 1}


@pytest.mark.parametrize("beta, loss", [(0.0, "forward_kl"), (1.0, "reverse_kl"), (0.3, "jsd")])
def test_kd_beta_chooses_the_divergence(beta, loss):
    conv = convert_config({**BASE, "plugins": ["axolotl.integrations.kd.KDPlugin"], "kd_trainer": True,
                           "kd_online_server_base_url": "http://t:8000/v1/", "kd_beta": beta})
    d = conv.recipe["distill"]
    assert d["loss"] == loss and d["teacher"] == {"url": "http://t:8000/v1"}
    assert d.get("beta") == (beta if loss == "jsd" else None)
    assert "kd_online_server_base_url" not in conv.notes  # /v1 was there already


def test_weights_that_do_not_add_up_to_one_and_an_sglang_server_are_reported():
    conv = convert_config({**BASE, "plugins": ["axolotl.integrations.kd.KDPlugin"], "kd_trainer": True,
                           "kd_online_server_base_url": "http://t:30000", "kd_online_server": "sglang",
                           "kd_online_topk": 4096, "kd_ce_alpha": 1.0, "kd_alpha": 1.0,
                           "kd_zscore_base_temp": 2.0, "kd_use_dynamic_temp": True})
    d = conv.recipe["distill"]
    assert d["sft_weight"] == 0.5 and "2 times the recipe's" in conv.notes["kd_ce_alpha"]
    assert d["top_k"] == 1024 and "1 to 1024" in conv.notes["kd_online_topk"]
    assert "OpenAI-compatible" in conv.notes["kd_online_server"]
    assert "z-score" in conv.notes["kd_zscore_base_temp"] and "dynamic" in conv.notes["kd_use_dynamic_temp"]


def test_without_the_plugin_or_kd_trainer_nothing_distills_and_the_kd_keys_are_reported():
    no_plugin = convert_config({**BASE, "kd_trainer": True, "kd_temperature": 2.0})
    assert no_plugin.recipe["stage"] == "sft" and "distill" not in no_plugin.recipe
    assert "does not distill" in no_plugin.notes["kd_trainer"]
    assert "this config does not distill" in no_plugin.notes["kd_temperature"]
    off = convert_config({**BASE, "plugins": ["axolotl.integrations.kd.KDPlugin"], "kd_trainer": False,
                          "kd_alpha": 0.9})
    assert off.recipe["stage"] == "sft" and "kd_trainer" in off.mapped and "kd_alpha" in off.notes
