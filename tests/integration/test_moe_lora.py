"""LoRA on a mixture of experts (the tiny Qwen3-MoE): adapters on attention and on every routed
expert, routers frozen unless the recipe trains them, the load-balancing loss and each layer's expert
load in metrics.jsonl."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

ROUTERS = ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight")
EXPERTS = ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj")


@pytest.fixture(scope="module")
def moe_run(tiny, tmp_path_factory):
    return tiny.train("moe-lora", tmp_path_factory.mktemp("moe") / "run")


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_moe_lora_learns(tiny, moe_run):
    loss = tiny.values(moe_run, "loss")
    assert loss[-1] < loss[0] - 3.0, loss


def test_moe_lora_adapts_the_experts_and_keeps_the_routers(moe_run):
    import torch

    cfg = json.loads((moe_run / "final" / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["experts.down_proj", "experts.gate_up_proj"]
    assert not any("gate" in t.split(".")[-1] for t in cfg["target_modules"])  # no router adapters
    base, merged = _weights(moe_run / "base_model"), _weights(moe_run / "merged")
    for name in ROUTERS:  # frozen: bitwise the random-init router
        assert torch.equal(base[name], merged[name]), name
    for name in EXPERTS:  # every expert's LoRA pair merged into the fused weights
        changed = (base[name] - merged[name]).abs().amax(dim=(1, 2))
        assert bool((changed > 0).all()), (name, changed)
    assert not torch.equal(base["model.layers.0.self_attn.q_proj.weight"],
                           merged["model.layers.0.self_attn.q_proj.weight"])


def test_moe_metrics_hold_aux_loss_and_expert_load(tiny, moe_run):
    train = [r for r in tiny.records(moe_run, "train") if "loss" in r]
    assert train and all("moe/aux_loss" in r and "moe/expert_load" in r for r in train), train[0]
    for record in train:
        load = record["moe/expert_load"]
        assert len(load) == 2 and all(len(layer) == 8 for layer in load)
        # every routed position picks 2 of the 8 experts, in both layers alike
        assert sum(load[0]) == sum(load[1]) > 0 and sum(load[0]) % 2 == 0
        assert record["moe/load_imbalance"] >= 1.0
    assert all(r["moe/aux_loss"] > 0 for r in train)


def test_moe_merged_model_loads_in_transformers(moe_run):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_run / "merged")
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3, 4]]))
    assert out.logits.shape == (1, 4, model.config.vocab_size)


def test_router_trains_when_the_recipe_says_so(tiny, tmp_path):
    import torch

    run = tiny.train("moe-lora", tmp_path / "router", "moe.train_router=true", "train.max_steps=6",
                     "output.save_steps=6")
    cfg = json.loads((run / "final" / "adapter_config.json").read_text())
    assert set(cfg["modules_to_save"]) >= {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}
    base, merged = _weights(run / "base_model"), _weights(run / "merged")
    for name in ROUTERS:
        assert not torch.equal(base[name], merged[name]), name


def test_full_fine_tune_keeps_routers_frozen(tiny, tmp_path):
    import torch

    from recipeforge.components.models import build_tiny_model

    run = tiny.train("moe-lora", tmp_path / "full", "adapter.type=none", "~adapter.modules_to_save",
                     "train.max_steps=4", "output.save_steps=4", "output.merge_adapter=false",
                     "train.learning_rate=1e-3")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # final/ is written in the hub's per-expert layout; transformers fuses the experts again on load
    final = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    start = build_tiny_model("qwen3_moe", AutoTokenizer.from_pretrained(run / "final"), seed=42,
                             dtype=torch.float32, attn_implementation="sdpa").state_dict()
    for name in ROUTERS:
        assert torch.equal(start[name], final[name]), name
    assert not torch.equal(start[EXPERTS[0]], final[EXPERTS[0]])


def test_expert_load_is_counted_once_under_gradient_checkpointing(tiny, tmp_path):
    runs = {}
    for ckpt in ("false", "true"):
        run = tiny.train("moe-lora", tmp_path / f"ckpt-{ckpt}", f"train.gradient_checkpointing={ckpt}",
                         "train.max_steps=2", "train.logging_steps=1", "output.save_steps=2",
                         "output.merge_adapter=false")
        runs[ckpt] = [r["moe/expert_load"] for r in tiny.records(run, "train") if "moe/expert_load" in r]
    assert runs["true"] and runs["true"] == runs["false"]  # the recomputed forward does not count again
