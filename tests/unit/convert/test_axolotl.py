"""`recipeforge convert axolotl`: every Axolotl config under tests/data/axolotl converts to a recipe that
loads, validates and plans, and every key it holds is either mapped or reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import convert_config, convert_file, read_config
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.world import plan_for_world

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted((ROOT / "tests" / "data" / "axolotl").glob("*.yaml"))


def convert_and_load(path: Path, tmp_path: Path, world_size: int = 8):
    conv = convert_file(path, world_size=world_size)
    out = tmp_path / "recipe.yaml"
    out.write_text(conv.recipe_text())
    return conv, load_recipe(out)


def input_keys(config: dict) -> list[str]:
    """Every key a conversion must account for: top level, dataset entries, trl: and fsdp_config:."""
    keys = list(config)
    for section in ("datasets", "test_datasets", "pretraining_dataset"):
        entries = config.get(section) or []
        for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
            keys += [f"{section}[{i}].{k}" for k in (entry or {})]
    for section in ("trl", "fsdp_config", "bnb_config_kwargs"):
        keys += [f"{section}.{k}" for k in (config.get(section) or {})]
    return keys


def test_there_are_enough_configs_of_every_kind():
    assert len(CONFIGS) >= 20
    texts = {p.name: p.read_text() for p in CONFIGS}
    assert sum("rl: grpo" in t for t in texts.values()) >= 2
    assert sum("rl: dpo" in t for t in texts.values()) >= 2
    assert sum("deepspeed:" in t and "deepspeed:\n" not in t for t in texts.values()) >= 4
    assert sum("fsdp_config:\n  " in t for t in texts.values()) >= 3
    assert sum("load_in_4bit: true" in t for t in texts.values()) >= 3
    assert sum("type: chat_template" in t for t in texts.values()) >= 3
    assert sum("type: completion" in t or "pretraining_dataset" in t for t in texts.values()) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_config_converts_validates_plans_and_loses_nothing(path, tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "1")  # as a user who reviewed converted reward code would
    conv, loaded = convert_and_load(path, tmp_path)
    plan = plan_for_world(loaded.recipe, hardware=parse_hardware("8xH100-80GB"))
    assert plan.world_size == 8 and plan.global_batch_size == loaded.recipe.train.global_batch_size
    config = yaml.safe_load(path.read_text())
    lost = [k for k in input_keys(config) if k not in conv.mapped and k not in conv.notes]
    assert not lost, f"keys neither mapped nor reported: {lost}"
    text = conv.recipe_text()
    for key in conv.notes:  # the report heads the recipe as comments, one entry per key
        assert f"#   {key}: " in text
    assert loaded.recipe.model.name_or_path == config["base_model"]


def test_lora_alpaca_mapping(tmp_path):
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-lora-alpaca.yaml", tmp_path, world_size=8)
    r = loaded.recipe
    assert (r.stage, r.adapter.type, r.adapter.r, r.adapter.alpha, r.adapter.target_modules) == (
        "sft", "lora", 32, 16, "all-linear")
    assert (r.train.micro_batch_size, r.train.global_batch_size) == (2, 2 * 4 * 8)
    assert (r.train.optimizer, r.train.scheduler, r.train.learning_rate, r.train.epochs) == (
        "adamw_8bit", "cosine", 2e-4, 4.0)
    assert (r.data.sequence_len, r.data.packing, r.data.val_size) == (4096, True, 0.05)
    assert r.model.attn_implementation == "flash_attention_2" and r.model.dtype == "auto"
    assert r.data.datasets[0].format == "alpaca"
    assert "world size 8" in conv.notes["gradient_accumulation_steps"]
    assert "special_tokens" in conv.notes and "pad_to_sequence_len" in conv.notes


def test_qlora_chat_template_dataset(tmp_path):
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-qlora-chat-template.yaml", tmp_path)
    r = loaded.recipe
    assert r.adapter.type == "qlora" and r.adapter.quant.bits == 4 and r.adapter.quant.double_quant is True
    assert r.adapter.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    ds = r.data.datasets[0]
    assert (ds.format, dict(ds.columns), ds.split) == ("messages", {"messages": "conversations"}, "train[:20%]")
    assert r.data.chat_template == "chatml" and r.model.attn_implementation == "sdpa"
    assert (r.train.seed, r.output.save_steps, r.train.eval_steps, r.output.save_total_limit) == (1234, 200, 100, 3)


def test_deepspeed_json_is_read_and_names_are_parsed(tmp_path):
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-full-deepspeed-zero3.yaml", tmp_path)
    d = loaded.recipe.distributed
    assert (d.backend, d.zero_stage, d.offload) == ("deepspeed", 3, "none")
    assert loaded.recipe.output.push_to_hub.repo_id == "my-org/llama8b-alpaca"
    assert loaded.recipe.logging.wandb.mode == "offline" and loaded.recipe.logging.wandb.entity == "my-team"
    assert loaded.recipe.data.datasets[1].columns == {"output": "response"}  # gpteacher
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-full-deepspeed-byname.yaml", tmp_path)
    d = loaded.recipe.distributed
    assert (d.backend, d.zero_stage, d.offload, d.timeout_minutes) == ("deepspeed", 3, "optimizer+params", 120)
    assert "read from its name" in conv.notes["deepspeed"]
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-lora-deepspeed-zero2-offload.yaml", tmp_path)
    d = loaded.recipe.distributed
    assert (d.zero_stage, d.offload, loaded.recipe.train.optimizer) == (2, "optimizer", "adamw")


def test_fsdp_and_the_combinations_recipeforge_refuses(tmp_path):
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-full-fsdp.yaml", tmp_path)
    d = loaded.recipe.distributed
    assert (d.backend, d.fsdp_sharding, d.offload) == ("fsdp", "full_shard", "none")
    assert loaded.recipe.train.gradient_checkpointing is True and loaded.recipe.data.chat_template == "llama3"
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-lora-fsdp-offload.yaml", tmp_path)
    assert loaded.recipe.distributed.offload == "optimizer+params"
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-qlora-fsdp.yaml", tmp_path)
    assert loaded.recipe.distributed.backend == "deepspeed" and "ZeRO-2" in conv.notes["fsdp"]
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-qlora-zero3.yaml", tmp_path)
    assert loaded.recipe.distributed.zero_stage == 2 and "ZeRO-3 cannot" in conv.notes["deepspeed"]
    assert loaded.recipe.data.datasets[0].columns == {"messages": "conversations"}  # legacy sharegpt


def test_preference_stages(tmp_path):
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-lora-chatml-intel.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.dpo.beta, r.dpo.label_smoothing, r.dpo.max_prompt_length) == ("dpo", 0.05, 0.1, 1024)
    assert [d.format for d in r.data.datasets] == ["preference", "preference"]
    assert r.data.datasets[0].columns == {"prompt": "question"} and r.data.chat_template == "chatml"
    assert r.data.datasets[1].columns == {"prompt": "instruction", "chosen": "chosen_response",
                                          "rejected": "rejected_response"}
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-ipo-chat-template.yaml", tmp_path)
    assert loaded.recipe.dpo.loss_type == "ipo" and loaded.recipe.data.datasets[0].columns == {"prompt": "messages"}
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-qlora-llama3-ultra.yaml", tmp_path)
    assert (loaded.recipe.dpo.loss_type, loaded.recipe.dpo.beta, loaded.recipe.data.chat_template) == (
        "ipo", 0.2, "llama3")
    for name, method in (("orpo-lora.yaml", "orpo"), ("kto-lora.yaml", "kto"), ("simpo-full.yaml", "simpo")):
        conv, loaded = convert_and_load(ROOT / "tests/data/axolotl" / name, tmp_path)
        assert loaded.recipe.stage == "dpo" and f"'{method}' has no counterpart" in conv.notes["rl"]
        assert any(k in conv.notes for k in ("orpo_alpha", "kto_desirable_weight", "simpo_gamma"))


def test_grpo_rewards_and_settings(tmp_path, monkeypatch):
    # Reward functions are code: the converted recipe names them, and importing them stays an opt-in.
    conv = convert_file(ROOT / "tests/data/axolotl/grpo-gsm8k.yaml", world_size=1)
    assert "allow_code" not in conv.recipe and "--trust-code" in conv.notes["trl.reward_funcs"]
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "1")
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/grpo-gsm8k.yaml", tmp_path, world_size=1)
    g = loaded.recipe.grpo
    assert [(x.name, x.weight) for x in g.rewards] == [("rewards:rand_reward_func", 1.0), ("rewards:format_reward", 0.5)]
    assert (g.num_generations, g.max_completion_length, g.beta, g.loss_type, g.scale_rewards, g.temperature) == (
        4, 256, 0.001, "dr_grpo", "none", 0.9)
    assert loaded.recipe.allow_code is False
    assert loaded.recipe.train.global_batch_size == 8  # 2 x 3 x 1 = 6, raised to a multiple of 4
    assert loaded.recipe.data.datasets[0].format == "prompt" and "trl.use_vllm" in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/grpo-full-zero3.yaml", tmp_path)
    assert [x.name for x in loaded.recipe.grpo.rewards] == ["length"] and "placeholder" in conv.notes["trl.reward_funcs"]
    assert "trl.log_completions" in conv.notes


def test_pretraining_and_other_dataset_types(tmp_path):
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/pretrain-completion.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.data.datasets[0].format, dict(r.data.datasets[0].columns)) == ("pretrain", "text",
                                                                                       {"text": "content"})
    assert (r.train.scheduler, r.train.max_steps, r.logging.tensorboard) == ("wsd", 5000, True)
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/pretrain-streaming.yaml", tmp_path)
    ds = loaded.recipe.data.datasets[0]
    assert (loaded.recipe.stage, ds.path, ds.name, loaded.recipe.data.num_proc) == (
        "pretrain", "HuggingFaceFW/fineweb-edu", "sample-10BT", 8)
    assert "pretraining_dataset[0].skip" in conv.notes and "streaming" in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-input-output.yaml", tmp_path)
    assert loaded.recipe.data.datasets[0].format == "completion" and "datasets[0].type" in conv.notes
    assert len(loaded.recipe.data.eval_datasets) == 1
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-pretokenized.yaml", tmp_path)
    assert "pre-tokenized" in conv.notes["datasets[0].type"] and "tokens" in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-dora-custom-prompt.yaml", tmp_path)
    r = loaded.recipe
    assert r.adapter.use_dora and r.adapter.modules_to_save == ("embed_tokens", "lm_head")
    assert dict(r.data.datasets[0].columns) == {"instruction": "question", "input": "context", "output": "answer"}
    assert r.model.dtype == "fp16" and r.model.attn_implementation == "eager" and "lr_scheduler" in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-8bit-lora-sharegpt.yaml", tmp_path)
    assert loaded.recipe.adapter.type == "qlora" and loaded.recipe.adapter.quant.bits == 8
    assert "prompter" in conv.notes["datasets[0].roles"] and "USER" not in conv.notes["datasets[0].roles"] and "chat_template" in conv.notes


def test_logging_output_resume_and_unknown_keys(tmp_path):
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-logging-resume.yaml", tmp_path)
    r = loaded.recipe
    assert r.output.resume == "./outputs/sft/checkpoint-300" and r.output.push_to_hub.private is True
    assert (r.logging.wandb.mode, r.logging.mlflow.experiment, r.logging.mlflow.tracking_uri) == (
        "disabled", "sft-runs", "http://mlflow.local")
    assert (r.data.val_size, r.train.load_best_model_at_end, r.train.seed) == (200, True, 7)
    assert conv.notes["some_future_key"].startswith("no counterpart")
    assert "datasets[0].shards" in conv.notes and "wandb_run_id" in conv.notes


@pytest.mark.parametrize("text, message", [
    ("- just\n- a list\n", "mapping"),
    ("datasets: [{path: x, type: alpaca}]\n", "no base_model"),
    ("base_model: x\n", "neither datasets"),
    ("base_model: !!python/object/apply:os.system ['echo hi']\ndatasets: [{path: x}]\n", "not valid YAML"),
    ("{{{", "not valid YAML"),
])
def test_files_that_are_not_axolotl_configs(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=message):
        read_config(path)


def test_convert_config_takes_data():
    conv = convert_config({"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
                           "micro_batch_size": 3, "gradient_accumulation_steps": 2}, "x.yaml", world_size=4)
    assert conv.recipe["train"]["global_batch_size"] == 24 and conv.recipe["stage"] == "sft"


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_convert_exit_codes(tmp_path):
    out = tmp_path / "r.yaml"
    done = run_cli("convert", "axolotl", "tests/data/axolotl/sft-lora-alpaca.yaml", "-o", str(out), "--world-size", "8")
    assert done.returncode == 0, done.stderr
    assert "world size of 8" in done.stderr and "special_tokens: no counterpart" in done.stderr
    assert out.read_text().startswith("# Converted from the Axolotl config sft-lora-alpaca.yaml")
    assert run_cli("validate", str(out)).returncode == 0
    done = run_cli("convert", "axolotl", "tests/data/axolotl/grpo-gsm8k.yaml")
    assert done.returncode == 0 and yaml.safe_load(done.stdout)["stage"] == "grpo"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\n")
    done = run_cli("convert", "axolotl", str(bad))
    assert done.returncode == 2 and "no base_model" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("convert", "axolotl", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2 and "cannot read" in done.stderr


@pytest.mark.parametrize("key, value", [("micro_batch_size", "two"), ("learning_rate", "fast"), ("lora_r", None),
                                        ("num_epochs", [1]), ("sequence_len", 2048.5)])
def test_a_value_of_the_wrong_type_names_its_key(key, value):
    config = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
              "adapter": "lora", key: value}
    if value is None:  # null is Axolotl's "unset": nothing to convert, and no error
        assert "r" not in convert_config(config).recipe["adapter"]
        return
    with pytest.raises(RecipeError, match=f"{key}: expected a"):
        convert_config(config)
