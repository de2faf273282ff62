"""README.md model card: what was trained, how, on what, with which results; embeds the recipe."""

from __future__ import annotations

from pathlib import Path

import yaml

from recipeforge import __version__
from recipeforge.outputs.metrics import read_metrics, series


def render_model_card(*, recipe, recipe_data: dict, plan, data_stats: dict, run_dir: Path,
                      adapter: bool) -> str:
    """The model card text. Everything taken from the recipe comes from `recipe_data`, the redacted
    recipe, so neither a value read from a secret variable nor a credential written into the recipe
    (a URL's password) reaches the card."""
    from recipeforge.errors import redact_url_credentials

    name = _text(recipe_data.get("name")) or run_dir.name
    description = _text(recipe_data.get("description"))
    base = redact_url_credentials(str((recipe_data.get("model") or {}).get("name_or_path")
                                      or recipe.model.name_or_path))
    tags = ["recipeforge", recipe.stage] + (["lora"] if adapter else [])
    front = {"library_name": "peft" if adapter else "transformers", "tags": tags, "pipeline_tag": "text-generation"}
    if not base.startswith("tiny:"):
        front["base_model"] = base
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", f"# {name}", ""]
    if description:
        lines += [description, ""]
    what = {"pretrain": "pretrained", "sft": "fine-tuned (SFT)", "dpo": "trained with DPO",
            "grpo": "trained with GRPO"}[recipe.stage]
    how = "LoRA adapters" if recipe.adapter.type == "lora" else \
        "QLoRA adapters" if recipe.adapter.type == "qlora" else "all weights"
    lines += [f"`{base}` {what} on {how} with recipeforge {__version__}.", ""]
    lines += ["## Usage", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
    if adapter:
        lines += ["# final/ holds the adapter; merged/ (if written) the merged model",
                  "from peft import AutoPeftModelForCausalLM",
                  "model = AutoPeftModelForCausalLM.from_pretrained(\"final\")"]
    else:
        lines += ["model = AutoModelForCausalLM.from_pretrained(\"final\")"]
    lines += ["tokenizer = AutoTokenizer.from_pretrained(\"final\")", "```", ""]
    lines += _results(run_dir)
    if data_stats:
        lines += ["## Data", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in data_stats.items()]
        lines.append("")
    lines += ["## Plan", "", f"backend `{plan.backend}` on {plan.device} x {plan.world_size}, "
              f"micro batch {plan.micro_batch_size} x accumulation {plan.gradient_accumulation} = "
              f"global batch {plan.global_batch_size}, gradient checkpointing {plan.gradient_checkpointing}.", ""]
    lines += ["## Recipe", "", "Reproduce with `recipeforge train resolved_recipe.yaml`.", "", "```yaml",
              yaml.safe_dump(recipe_data, sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    return "\n".join(lines)


def _text(value) -> str | None:
    """A card-worthy string, or None for a missing or redacted one."""
    return value if isinstance(value, str) and value and not value.startswith("<redacted") else None


def _results(run_dir: Path) -> list[str]:
    records = read_metrics(run_dir / "metrics.jsonl")
    rows = []
    for key, label, split in (("loss", "train loss", "train"), ("eval_loss", "eval loss", "eval"),
                              ("rewards/accuracies", "reward accuracy", "train"),
                              ("rewards/margins", "reward margin", "train"), ("reward", "mean reward", "train")):
        values = series(records, key, split)
        if values:
            rows.append(f"| {label} | {values[0]:.4g} | {values[-1]:.4g} |")
    if not rows:
        return []
    return ["## Results", "", "| metric | first | last |", "|---|---|---|", *rows, ""]


def write_model_card(path: Path, **kwargs) -> None:
    path.write_text(render_model_card(**kwargs))
