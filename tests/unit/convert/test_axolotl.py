"""`recipeforge convert axolotl`: every Axolotl config under tests/data/axolotl converts to a recipe that
loads, validates and plans, and every key it holds is either mapped or reported (the
command's exit codes: tests/commands/test_axolotl.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import Conversion, convert_config, convert_file, read_config
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
    lost = [k for k in input_keys(config) if k not in conv.mapped and k not in conv.notes and k not in conv.changes]
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
    assert r.model.special_tokens.pad_token == "<|end_of_text|>" and "pad_to_sequence_len" in conv.notes


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
    # 4-bit QLoRA shards on FSDP and ZeRO-3 (weights stored in bf16 words); 8-bit falls back to ZeRO-2
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-qlora-fsdp.yaml", tmp_path)
    d = loaded.recipe.distributed
    assert (d.backend, d.offload, loaded.recipe.adapter.type) == ("fsdp", "optimizer+params", "qlora")
    assert "fsdp" not in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-qlora-zero3.yaml", tmp_path)
    assert loaded.recipe.distributed.zero_stage == 3 and "ZeRO-2" not in conv.notes["deepspeed"]
    eight = tmp_path / "sft-qlora8-zero3.yaml"
    eight.write_text((ROOT / "tests/data/axolotl/sft-qlora-zero3.yaml").read_text()
                     .replace("load_in_4bit: true", "load_in_8bit: true"))
    conv, loaded = convert_and_load(eight, tmp_path)
    assert loaded.recipe.distributed.zero_stage == 2 and "8-bit" in conv.notes["deepspeed"]
    assert loaded.recipe.data.datasets[0].columns == {"messages": "conversations"}  # legacy sharegpt


def test_preference_stages(tmp_path):
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-lora-chatml-intel.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.dpo.beta, r.dpo.label_smoothing, r.dpo.max_prompt_length) == ("dpo", 0.05, 0.1, 1024)
    assert [d.format for d in r.data.datasets] == ["preference", "preference"]
    # Axolotl's chatml.intel writes ChatML as text: so does the recipe (texts), leaving the tokenizer's tokens
    # and chat template as Axolotl does (tests/unit/convert/test_axolotl_preference_fidelity.py: the same tokens)
    assert r.data.datasets[0].columns == {"prompt": "question"} and r.data.chat_template == "tokenizer"
    assert r.data.datasets[0].texts.chosen == "{chosen}<|im_end|>"
    assert r.data.datasets[1].columns == {"prompt": "instruction", "chosen": "chosen_response",
                                          "rejected": "rejected_response"}
    assert "no DPO type 'chatml.argilla' and stops on it" in conv.notes["datasets[1].type"]
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-ipo-chat-template.yaml", tmp_path)
    assert loaded.recipe.dpo.loss_type == "ipo" and loaded.recipe.data.datasets[0].columns == {"prompt": "messages"}
    assert (loaded.recipe.data.chat_template, loaded.recipe.data.datasets[0].texts) == ("chatml", None)
    assert "two BOS" in conv.changes["datasets[0].type"]
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/dpo-qlora-llama3-ultra.yaml", tmp_path)
    assert (loaded.recipe.dpo.loss_type, loaded.recipe.dpo.beta) == ("ipo", 0.2)
    assert loaded.recipe.data.datasets[0].texts.rejected == "{rejected[1][content]}<|eot_id|>"


def test_orpo_kto_simpo_map_to_their_stages(tmp_path):
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/orpo-lora.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.orpo.beta, r.data.datasets[0].format) == ("orpo", 0.1, "preference")
    assert conv.mapped["orpo_alpha"] == "orpo.beta" and "rl" not in conv.notes
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/kto-lora.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.kto.beta, r.kto.desirable_weight, r.kto.undesirable_weight) == ("kto", 0.1, 1.0, 1.0)
    ds = r.data.datasets[0]
    assert (ds.format, dict(ds.columns), ds.texts.completion) == ("unpaired", {"prompt": "instruction"},
                                                                  "{completion}<|im_end|>")
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/simpo-full.yaml", tmp_path)
    c = loaded.recipe.cpo
    assert (loaded.recipe.stage, c.loss_type, c.beta, c.simpo_gamma, c.cpo_alpha) == ("cpo", "simpo", 2.0, 0.5, 0.0)
    assert not {"rl", "simpo_gamma", "cpo_alpha", "rl_beta"} & set(conv.notes)


def test_preference_stage_settings_follow_axolotl(tmp_path):
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "sequence_len": 512, "micro_batch_size": 2,
            "gradient_accumulation_steps": 1}
    # SimPO without cpo_alpha: Axolotl keeps TRL's NLL weight 1.0, which the recipe spells out.
    conv = convert_config({**base, "rl": "simpo", "max_prompt_len": 128,
                           "datasets": [{"path": "d", "type": "chatml.prompt_pairs"}]})
    assert conv.recipe["cpo"] == {"loss_type": "simpo", "cpo_alpha": 1.0}
    assert "cpo_alpha 1.0" in conv.notes["rl"] and "max_prompt_len" in conv.notes
    conv = convert_config({**base, "rl": "cpo", "datasets": [{"path": "d", "type": "chatml.intel"}]})
    assert conv.recipe["stage"] == "cpo" and "cpo" not in conv.recipe
    assert conv.recipe["data"]["datasets"][0]["columns"] == {"prompt": "question"}
    # beta: trl.beta, then rl_beta, then orpo_alpha; the unused ones are reported.
    conv = convert_config({**base, "rl": "orpo", "rl_beta": 0.2, "orpo_alpha": 0.5, "max_prompt_len": 64,
                           "datasets": [{"path": "d", "type": "chatml.argilla"}]})
    assert conv.recipe["orpo"] == {"beta": 0.2, "max_prompt_length": 64}
    assert "rl_beta first" in conv.notes["orpo_alpha"]
    conv = convert_config({**base, "rl": "kto", "kto_desirable_weight": 1.33, "simpo_gamma": 1.0,
                           "datasets": [{"path": "d", "type": {"field_prompt": "q", "field_completion": "a",
                                                               "field_label": "good"}},
                                        {"path": "e", "type": "llama3.argilla_chat"}]})
    assert conv.recipe["kto"] == {"desirable_weight": 1.33}
    first, second = conv.recipe["data"]["datasets"]
    assert first == {"path": "d", "format": "unpaired", "columns": {"prompt": "q", "completion": "a", "label": "good"}}
    assert second == {"path": "e", "format": "unpaired"}
    assert "every turn of `completion` before its last" in conv.changes["datasets[1].type"]
    assert conv.notes["simpo_gamma"] == "not a setting of stage kto; not converted"


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


def test_pretraining_and_other_dataset_types(tmp_path, monkeypatch):
    monkeypatch.delenv("RECIPEFORGE_TRUST_CODE", raising=False)
    _, loaded = convert_and_load(ROOT / "tests/data/axolotl/pretrain-completion.yaml", tmp_path)
    r = loaded.recipe
    assert (r.stage, r.data.datasets[0].format, dict(r.data.datasets[0].columns)) == ("pretrain", "text",
                                                                                       {"text": "content"})
    assert (r.train.scheduler, r.train.max_steps, r.logging.tensorboard) == ("wsd", 5000, True)
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/pretrain-streaming.yaml", tmp_path)
    ds = loaded.recipe.data.datasets[0]
    assert (loaded.recipe.stage, ds.path, ds.name, loaded.recipe.data.num_proc) == (
        "pretrain", "HuggingFaceFW/fineweb-edu", "sample-10BT", 8)
    assert "pretraining_dataset[0].skip" in conv.notes and loaded.recipe.data.streaming
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-input-output.yaml", tmp_path)
    # input_output: segments with a train label each, as Axolotl tokenizes them (nothing to report)
    assert loaded.recipe.data.datasets[0].format == "segments" and "datasets[0].type" not in conv.notes
    assert len(loaded.recipe.data.eval_datasets) == 1
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-pretokenized.yaml", tmp_path)
    assert loaded.recipe.data.datasets[0].format == "tokenized" and loaded.recipe.model.tokens == ("<|tool|>",)
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-dora-custom-prompt.yaml", tmp_path)
    r = loaded.recipe
    assert r.adapter.use_dora and r.adapter.modules_to_save == ("embed_tokens", "lm_head")
    assert dict(r.data.datasets[0].columns) == {"instruction": "question", "input": "context", "output": "answer"}
    # the type's own format strings are the prompt (not the chat template)
    assert r.data.datasets[0].prompt.turn == "[INST] {instruction} {input} [/INST]" and not conv.changes
    assert r.model.dtype == "fp16" and r.model.attn_implementation == "eager" and "lr_scheduler" in conv.notes
    # trust_remote_code: true is code the recipe runs: the converted recipe loads only with the opt-in.
    with pytest.raises(RecipeError, match="model.trust_remote_code.*needs an opt-in"):
        convert_and_load(ROOT / "tests/data/axolotl/sft-8bit-lora-sharegpt.yaml", tmp_path)
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "1")
    conv, loaded = convert_and_load(ROOT / "tests/data/axolotl/sft-8bit-lora-sharegpt.yaml", tmp_path)
    assert "--trust-code" in conv.notes["trust_remote_code"]
    assert loaded.recipe.adapter.type == "qlora" and loaded.recipe.adapter.quant.bits == 8
    ds = loaded.recipe.data.datasets[0]
    assert ds.messages.roles == {"user": ("USER", "prompter")} and ds.messages.field == "conversations"
    assert ds.messages.system_prompt == "You are a helpful assistant." and loaded.recipe.data.chat_template == "phi3"


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


def test_random_init_weights_becomes_model_init():
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "completion"}]}
    conv = convert_config({**base, "random_init_weights": True}, "x.yaml")
    assert conv.recipe["model"]["init"] == "random" and conv.mapped["random_init_weights"] == "model.init"
    assert convert_config({**base, "random_init_weights": False}, "x.yaml").recipe["model"]["init"] == "pretrained"


def test_activation_offloading_becomes_train_activation_offloading(tmp_path):
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
            "gradient_checkpointing": True}
    for extra in ({"activation_offloading": True}, {"activation_offloading": "legacy"},
                  {"gradient_checkpointing": "offload"}):
        conv = convert_config({**base, **extra}, "x.yaml")
        assert conv.recipe["train"]["activation_offloading"] is True, extra
        assert conv.recipe["train"]["gradient_checkpointing"] is True
        assert "train.activation_offloading" in conv.mapped[next(iter(extra))]
        out = tmp_path / "r.yaml"
        out.write_text(conv.recipe_text())
        assert load_recipe(out).recipe.train.activation_offloading is True
    conv = convert_config({**base, "activation_offloading": "disk"}, "x.yaml")
    assert conv.recipe["train"]["activation_offloading"] is True and "disk" in conv.notes["activation_offloading"]
    assert "activation_offloading" not in convert_config(base, "x.yaml").recipe["train"]


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


def test_unfrozen_parameters_and_torchao_optimizers(tmp_path):
    base = {"base_model": "mistralai/Mixtral-8x7B-v0.1", "datasets": [{"path": "d.jsonl", "type": "alpaca"}]}
    patterns = ["^lm_head.weight$", "^model.embed_tokens.weight$[:32000]", r"model.layers.2[0-9]+.mlp.gate.[a-z]+$"]
    conv = convert_config({**base, "unfrozen_parameters": patterns, "optimizer": "adamw_torch_4bit"}, "x.yaml")
    assert conv.recipe["train"]["unfrozen_parameters"] == patterns
    assert conv.mapped["unfrozen_parameters"] == "train.unfrozen_parameters"
    assert conv.recipe["train"]["optimizer"] == "adamw_torchao_4bit"
    out = tmp_path / "r.yaml"
    out.write_text(conv.recipe_text())
    recipe = load_recipe(out).recipe
    assert list(recipe.train.unfrozen_parameters) == patterns
    plan = plan_for_world(recipe, hardware=parse_hardware("8xH100-80GB"))
    # Mixtral's output layer, embeddings and the routers of layers 20-29 train
    assert plan.extra.model["trainable_params"] == 2 * 32000 * 4096 + 10 * 8 * 4096
    for name, ours in (("adamw_torch_8bit", "adamw_torchao_8bit"), ("ao_adamw_8bit", "adamw_torchao_8bit"),
                       ("adamw_torchao_4bit", "adamw_torchao_4bit"), ("ao_adamw_4bit", "adamw_torchao_4bit")):
        assert convert_config({**base, "optimizer": name}, "x.yaml").recipe["train"]["optimizer"] == ours
    single = convert_config({**base, "unfrozen_parameters": "model.layers.0."}, "x.yaml")
    assert single.recipe["train"]["unfrozen_parameters"] == ["model.layers.0."]
    with_lora = convert_config({**base, "adapter": "lora", "unfrozen_parameters": patterns}, "x.yaml")
    assert "unfrozen_parameters" not in with_lora.recipe.get("train", {})
    assert "modules_to_save" in with_lora.notes["unfrozen_parameters"]


def test_chat_data_keys_map_to_templates_field_mappings_and_tokens(tmp_path):
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "sequence_len": 512, "micro_batch_size": 1, "num_epochs": 1,
            "learning_rate": 1e-5}
    conv = convert_config({**base, "chat_template": "qwen_25", "special_tokens": {"pad_token": "<|pad|>",
                           "sep_token": "<sep>"}, "tokens": ["<tool>"], "eot_tokens": ["<|im_end|>"],
                           "added_tokens_overrides": {"151643": "<x>"}, "dataset_exact_deduplication": True,
                           "default_system_message": "Be brief.",
                           "datasets": [{"path": "d.jsonl", "type": "chat_template", "field_messages": "conv",
                                         "message_property_mappings": {"role": "speaker", "content": "text"},
                                         "roles": {"user": ["customer", "human"], "assistant": ["agent"],
                                                   "narrator": ["n"]},
                                         "field_system": "sys", "message_field_training": "learn"},
                                        {"path": "t.jsonl", "type": None}]})
    chat, tokenized = conv.recipe["data"]["datasets"]
    assert chat["messages"] == {"field": "conv", "role": "speaker", "content": "text",
                                "roles": {"user": ["customer"], "assistant": ["agent"]}, "system_field": "sys",
                                "train_field": "learn", "system_prompt": "Be brief."}
    assert tokenized == {"path": "t.jsonl", "format": "tokenized"}
    assert conv.recipe["data"]["chat_template"] == "qwen2.5" and conv.recipe["data"]["dedup"] is True
    assert conv.recipe["model"]["special_tokens"] == {"pad_token": "<|pad|>"}
    assert (conv.recipe["model"]["tokens"], conv.recipe["model"]["eot_tokens"]) == (["<tool>"], ["<|im_end|>"])
    assert "bos_token" in conv.notes["special_tokens.sep_token"] and "narrator" in conv.notes["datasets[0].roles"]
    assert "model.tokens" in conv.notes["added_tokens_overrides"]
    for key in ("datasets[0].field_system", "datasets[0].message_field_training", "default_system_message"):
        assert key in conv.mapped, key
    out = tmp_path / "recipe.yaml"
    out.write_text(conv.recipe_text())
    r = load_recipe(out).recipe  # the converted recipe is valid
    assert r.data.datasets[0].messages.train_field == "learn" and r.model.tokens == ("<tool>",)


@pytest.mark.parametrize("name, expected", [("llama4", "llama4"), ("gemma3", "gemma3"), ("qwen3", "qwen3"),
                                            ("mistral_v3_tekken", "mistral_v3_tekken"), ("phi_3", "phi3"),
                                            ("deepseek_v3", "deepseek_v3"), ("tokenizer_default", "tokenizer")])
def test_axolotl_template_names(name, expected):
    conv = convert_config({"base_model": "m", "chat_template": name, "datasets": [{"path": "d", "type": "chat_template"}]})
    assert conv.recipe["data"]["chat_template"] == expected and "chat_template" not in conv.notes


def test_a_jinja_template_file_becomes_the_chat_template():
    base = {"base_model": "m", "chat_template": "jinja", "datasets": [{"path": "d", "type": "chat_template"}]}
    conv = convert_config({**base, "chat_template_jinja": "templates/mine.jinja"})
    assert conv.recipe["data"]["chat_template"] == "templates/mine.jinja" and "chat_template" in conv.mapped
    conv = convert_config({**base, "chat_template_jinja": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    assert "save it as a .jinja file" in conv.notes["chat_template_jinja"]


def test_reward_model_true_is_the_reward_stage():
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "sequence_len": 512, "micro_batch_size": 2,
            "datasets": [{"path": "d", "type": "bradley_terry.chat_template"}]}
    conv = convert_config({**base, "reward_model": True, "type_of_model": "AutoModelForSequenceClassification",
                           "num_labels": 1})
    assert conv.recipe["stage"] == "reward"
    assert {"reward_model", "type_of_model", "num_labels"} <= set(conv.mapped)
    assert not {"reward_model", "type_of_model", "num_labels"} & set(conv.notes)
    # Axolotl's older spelling of the class key; more than one label is reported (a reward has one score)
    conv = convert_config({**base, "reward_model": True, "rl": "dpo", "num_labels": 2,
                           "model_type": "AutoModelForSequenceClassification"})
    assert conv.recipe["stage"] == "reward" and "model_type" in conv.mapped and "model_type" not in conv.notes
    assert "one output" in conv.notes["num_labels"] and "trains a reward model" in conv.notes["rl"]
    conv = convert_config({**base, "reward_model": False})
    assert conv.recipe["stage"] == "sft" and "reward_model" in conv.mapped


def test_the_loss_watchdog_becomes_the_divergence_stop(tmp_path):
    config = yaml.safe_load((ROOT / "tests/data/axolotl/sft-lora-alpaca.yaml").read_text())
    config.update(loss_watchdog_threshold=5.0, loss_watchdog_patience=4)
    source = tmp_path / "watchdog.yaml"
    source.write_text(yaml.safe_dump(config))
    conv, loaded = convert_and_load(source, tmp_path)
    d = loaded.recipe.train.divergence
    assert (d.on_spike, d.spike_factor, d.spike_patience, d.stop_on_nan) == ("stop", 2.0, 4, True)
    assert conv.mapped["loss_watchdog_patience"] == "train.divergence.spike_patience"
    assert "absolute loss (5)" in conv.notes["loss_watchdog_threshold"]
    assert "loss_watchdog_patience" not in conv.notes  # mapped, not reported as lost


def test_axolotls_defaults_are_written_where_recipeforges_differ(tmp_path):
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "alpaca"}]}
    conv = convert_config(base)
    assert conv.recipe["data"]["sequence_len"] == 512 and conv.recipe["data"]["truncation"] == "drop"
    conv = convert_config({**base, "excess_length_strategy": "truncate"})
    assert conv.recipe["data"]["truncation"] == "truncate" and not conv.changes
    conv = convert_config({**base, "excess_length_strategy": "raise"})
    assert conv.recipe["data"]["truncation"] == "drop" and "stops" in conv.changes["excess_length_strategy"]
    # raw text: split into sequence_len pieces and not packed unless sample_packing says so, as Axolotl does
    conv = convert_config({**base, "datasets": [{"path": "d.jsonl", "type": "completion"}]})
    assert conv.recipe["stage"] == "pretrain" and conv.recipe["data"]["packing"] is False
    assert "truncation" not in conv.recipe["data"]
    # preference rows: Axolotl drops long ones, the stage cuts them: reported with the way to match
    conv = convert_config({**base, "rl": "dpo", "datasets": [{"path": "d.jsonl", "type": "chatml.intel"}]})
    assert "drops dpo rows longer than sequence_len" in conv.changes["sequence_len"]


def test_lora_targets_all_linear_leaves_out_are_reported_with_the_fix():
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
            "adapter": "lora", "lora_target_linear": True}
    conv = convert_config({**base, "lora_target_modules": ["lm_head", "q_proj"]})
    assert conv.recipe["adapter"]["target_modules"] == "all-linear"
    assert conv.changes["lora_target_modules"].startswith("Axolotl puts LoRA on lm_head as well")
    assert "adapter.target_modules" in conv.changes["lora_target_modules"]
    conv = convert_config({**base, "lora_target_modules": ["q_proj", "v_proj"]})
    assert not conv.changes and "all-linear already covers" in conv.notes["lora_target_modules"]


def test_semantic_changes_head_their_own_report_section(tmp_path):
    conv = convert_config({"base_model": "Qwen/Qwen2.5-0.5B", "adapter": "lora", "lora_target_linear": True,
                           "lora_target_modules": ["lm_head"],
                           "datasets": [{"path": "d.jsonl", "type": "my_own_module.load"},
                                        {"path": "c.jsonl", "type": "chat_template", "roles_to_train": ["user"],
                                         "drop_system_message": True, "train_on_eos": "turn"}]})
    assert set(conv.changes) == {"lora_target_modules", "datasets[0].type", "datasets[1].roles_to_train",
                                 "datasets[1].drop_system_message"}
    assert "datasets[1].train_on_eos" in conv.mapped  # Axolotl's `turn` is what the recipe trains
    report = conv.report_text()
    assert "4 semantic changes" in report and Conversion.CHANGES_HEAD in report
    assert report.index(Conversion.CHANGES_HEAD) < report.index("datasets[1].roles_to_train: ")
    text = conv.recipe_text()
    assert f"# {Conversion.CHANGES_HEAD}" in text and "#   datasets[0].type: " in text
    (tmp_path / "recipe.yaml").write_text(text)
    load_recipe(tmp_path / "recipe.yaml")
