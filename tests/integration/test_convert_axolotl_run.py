"""An Axolotl alpaca LoRA config, as a migrating user takes it: `recipeforge convert axolotl`, then
`recipeforge train` on the converted recipe. The run trains Axolotl's alpaca prompt, and the model it
saves is prompted the same way: the tokenizer's chat template writes that prompt (what `chat` and `serve`
send), and the model card names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_converted_alpaca_lora_trains_and_chats_in_axolotls_prompt(tmp_path):
    (tmp_path / "alpaca.jsonl").write_text((REPO / "examples/data/sft-alpaca.jsonl").read_text())
    config = {"base_model": "tiny:llama", "datasets": [{"path": "alpaca.jsonl", "type": "alpaca"}],
              "adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True,
              "micro_batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 2, "learning_rate": 1e-3,
              "output_dir": "run", "sequence_len": 256}
    (tmp_path / "axolotl.yaml").write_text(yaml.safe_dump(config))
    done = run("convert", "axolotl", "axolotl.yaml", "-o", "recipe.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "0 semantic changes" in done.stderr
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert recipe["data"]["datasets"][0]["prompt"]["turn_no_input"] == "### Instruction:\n{instruction}\n\n### Response:\n"
    assert recipe["data"]["truncation"] == "drop"

    trained = run("train", "recipe.yaml", "logging.progress_bar=false", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    final = tmp_path / "run" / "final"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(final)
    row = json.loads((tmp_path / "alpaca.jsonl").read_text().splitlines()[0])
    sent = tokenizer.apply_chat_template([{"role": "user", "content": row["instruction"]}], tokenize=False,
                                         add_generation_prompt=True)
    assert sent == tokenizer.bos_token + NO_INPUT.format(instruction=row["instruction"])
    card = (tmp_path / "run" / "README.md").read_text()
    assert "## Prompt format" in card and "### Instruction:\n{instruction}\n\n### Response:\n" in card
