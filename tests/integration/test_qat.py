"""Quantization-aware training (`train.qat`) end to end on the tiny model: the same recipe and seed
trained with and without int4 fake quantization, each exported with `recipeforge export --format
torchao-int4` as a user types it; the QAT run's int4 export must lose less perplexity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("torchao")

CHAT = Path(__file__).resolve().parents[2] / "examples" / "data" / "sft-chat.jsonl"
# The self-check's held rows: the training rows (sft-alpaca.jsonl) as chat messages, through the same
# chat template; the loss covers the prompts too, so the perplexity of every held token is one the
# model learned (an untrained prompt token's perplexity is noise that hides the int4 loss).
SETTINGS = ("train.max_steps=60", "train.eval_steps=60", "data.val_size=0", "output.save_steps=60",
            "data.train_on_inputs=true", f"data.eval_datasets=[{{path: {CHAT}, format: messages}}]")
# The group the export picks for the tiny model's 64-wide layers: both exports quantize in the same
# groups, so only the training differs.
GROUP = 64


def _export_int4(run_dir: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "recipeforge", "export", str(run_dir), "--format", "torchao-int4"],
                          capture_output=True, text=True, cwd=run_dir.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "export-torchao-int4" / "export.json").read_text())


def test_qat_makes_the_int4_export_lose_less(tiny, tmp_path):
    plain = tiny.train("sft-full", tmp_path / "plain" / "run", *SETTINGS)
    qat = tiny.train("sft-full", tmp_path / "qat" / "run", *SETTINGS, "train.qat.scheme=int4_weight",
                     f"train.qat.group_size={GROUP}")

    # final/ holds plain Linear weights under their usual names: transformers loads it as it is.
    from safetensors import safe_open

    def names(run: Path) -> list[str]:
        with safe_open(str(run / "final" / "model.safetensors"), "pt") as f:
            return sorted(f.keys())

    assert names(qat) == names(plain)
    assert "qat" in (qat / "resolved_recipe.yaml").read_text()

    records = {name: _export_int4(run) for name, run in (("plain", plain), ("qat", qat))}
    change = {name: r["self_check"]["perplexity_change"] for name, r in records.items()}
    for name, r in records.items():
        check = r["self_check"]
        print(f"{name}: perplexity {check['reference_perplexity']:.4f} -> {check['export_perplexity']:.4f} "
              f"({check['perplexity_change']:+.3%}), groups {r['settings']['granularity']}")
    for r in records.values():
        assert r["settings"]["granularity"] == f"per group of {GROUP}"
    assert "groups_from" in records["qat"]["settings"] and "groups_from" not in records["plain"]["settings"]
    assert records["qat"]["self_check"]["texts_from"].endswith("sft-chat.jsonl")
    assert change["qat"] < change["plain"], change


def test_int8_activations_with_int4_weights_train_and_save_plain_weights(tiny, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run = tiny.train("sft-full", tmp_path / "run", "train.max_steps=4", "data.val_size=0", "train.eval_steps=null",
                     "output.save_steps=4", "train.qat.scheme=int8_dynamic_act_int4_weight",
                     "train.qat.group_size=16")
    model = AutoModelForCausalLM.from_pretrained(str(run / "final"))
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    card = (run / "README.md").read_text()
    assert "int8_dynamic_act_int4_weight" in card and "--format torchao-int8-int4" in card
    assert '"qat"' in (run / "plan.json").read_text()

    # The export the scheme simulates, in the run's groups; the other int4 export says what it trained for.
    done = subprocess.run([sys.executable, "-m", "recipeforge", "export", str(run), "--format", "torchao-int8-int4"],
                          capture_output=True, text=True, cwd=run.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads((run / "export-torchao-int8-int4" / "export.json").read_text())["settings"]
    assert settings["granularity"] == "per group of 16" and "groups_from" in settings
    assert settings["activations"] == "int8, dynamic, per token" and "trained_for" not in settings
    other = _export_int4(run)["settings"]
    assert other["granularity"] == "per group of 16" and other["trained_for"] == "torchao-int8-int4"
