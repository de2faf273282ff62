"""A token read through ``${env:...}`` appears in no file of the run directory and in no message.

The recipe uses the token where free text goes (name, description), the run writes every kind of file
it can (checkpoints with training_args.bin, tensorboard events, final/, merged/, model card, plan,
environment, metrics), and every byte of every file is searched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.cli import main

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"
HF_TOKEN = "hf_sEcReT4TestOnly0123456789"
WANDB_KEY = "wandb_sEcReT4TestOnly9876543210"
pytestmark = pytest.mark.slow


def _files_holding(root: Path, needles: list[bytes]) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and any(n in p.read_bytes() for n in needles))


def test_secret_values_reach_no_file_and_no_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    run = tmp_path / "run"
    code = main(["train", str(TINY / "sft-lora.yaml"), f"output.dir={run}", f"data.cache_dir={tmp_path / 'c'}",
                 "name=run-${env:HF_TOKEN}", "description=Trained with key ${env:WANDB_API_KEY}",
                 "train.max_steps=4", "output.save_steps=2", "output.merge_adapter=true", "logging.tensorboard=true",
                 "logging.progress_bar=false"])
    out = capsys.readouterr()
    assert code == 0, out.err
    needles = [HF_TOKEN.encode(), WANDB_KEY.encode()]
    written = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}
    # The places a name or description could have been copied to were all written.
    assert {"resolved_recipe.yaml", "README.md", "plan.json", "environment.json", "metrics.jsonl",
            "checkpoints/checkpoint-4/training_args.bin", "final/adapter_model.safetensors",
            "merged/model.safetensors"} <= written
    assert any(name.startswith("tensorboard/") for name in written)
    assert _files_holding(run, needles) == []
    assert HF_TOKEN not in out.out + out.err and WANDB_KEY not in out.out + out.err
    resolved = (run / "resolved_recipe.yaml").read_text()
    assert "name: '<redacted: ${env:HF_TOKEN}>'" in resolved
    assert "description: '<redacted: ${env:WANDB_API_KEY}>'" in resolved

    # The resolved recipe reproduces the run: it is the same recipe, so the finished run is kept.
    assert main(["train", str(run / "resolved_recipe.yaml")]) == 2
    assert "already holds a finished run of this recipe" in capsys.readouterr().err

    # Messages quoting a value never quote a secret.
    assert main(["validate", str(TINY / "sft-lora.yaml"), "train.seed=${env:HF_TOKEN}"]) == 2
    err = capsys.readouterr().err
    assert "train.seed: expected an integer (got '<redacted: ${env:HF_TOKEN}>')" in err and HF_TOKEN not in err
    assert main(["plan", str(TINY / "sft-lora.yaml"), "name=${env:HF_TOKEN}"]) == 0
    assert HF_TOKEN not in capsys.readouterr().out


SHAPED = {"hf": "hf_" + "Tk9" * 12, "openai": "sk-proj-" + "Ab3_" * 10, "aws": "AKIA" + "Z3X7" * 4,
          "wandb": "Wb7" * 28 + "q2"}


def test_credentials_pasted_as_literals_are_found_by_their_shape(tmp_path, capsys):
    """No key names them: a token pasted into free text is still kept out of every file and message."""
    run = tmp_path / "run"
    code = main(["train", str(TINY / "sft-lora.yaml"), f"output.dir={run}", f"data.cache_dir={tmp_path / 'c'}",
                 f"name=run-{SHAPED['wandb']}",
                 f"description=pushed with {SHAPED['hf']}, judged with {SHAPED['openai']} on {SHAPED['aws']}",
                 "train.max_steps=4", "output.save_steps=2", "output.merge_adapter=true", "logging.tensorboard=true",
                 "logging.progress_bar=false"])
    out = capsys.readouterr()
    assert code == 0, out.err
    needles = [v.encode() for v in SHAPED.values()]
    assert _files_holding(run, needles) == []
    assert not any(v in out.out + out.err for v in SHAPED.values())
    resolved = (run / "resolved_recipe.yaml").read_text()
    assert "description: pushed with <redacted>, judged with <redacted> on <redacted>" in resolved
