"""README.md model card: what was trained, how, on what, with which results; embeds the recipe."""

from __future__ import annotations

from pathlib import Path

import yaml

from recipeforge.stage_specs import Stage, stage_spec
from recipeforge import __version__
from recipeforge.outputs.metrics import read_metrics, series


def render_model_card(*, recipe, recipe_data: dict, plan, data_stats: dict, run_dir: Path,
                      adapter: bool) -> str:
    """The model card text. Everything taken from the recipe comes from `recipe_data`, the redacted
    recipe, so neither a value read from a secret variable nor a credential written into the recipe
    (a URL's password) reaches the card."""
    from recipeforge.credentials import redact_credentials

    name = _text(recipe_data.get("name")) or run_dir.name
    description = _text(recipe_data.get("description"))
    base = redact_credentials(str((recipe_data.get("model") or {}).get("name_or_path")
                                      or recipe.model.name_or_path))
    tags = ["recipeforge", recipe.stage] + (["lora"] if adapter else [])
    reward = stage_spec(recipe.stage).scores  # a sequence-classification model that scores, not a generator
    front = {"library_name": "peft" if adapter else "transformers", "tags": tags,
             "pipeline_tag": "text-classification" if reward else "text-generation"}
    if not base.startswith("tiny:"):
        front["base_model"] = base
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", f"# {name}", ""]
    if description:
        lines += [description, ""]
    what = stage_spec(recipe.stage).trained_as
    if recipe.stage == Stage.CPO and recipe.cpo.loss_type == "simpo":
        what = "trained with SimPO (TRL's CPO trainer, simpo loss)"
    how = "LoRA adapters" if recipe.adapter.type == "lora" else \
        "QLoRA adapters" if recipe.adapter.type == "qlora" else "all weights"
    lines += [f"`{base}` {what} on {how} with recipeforge {__version__}.", ""]
    qat = recipe.train.qat
    if qat is not None:
        from recipeforge.components.qat import export_format

        lines += [f"Trained quantization-aware (torchao fake quantization `{qat.scheme}`, int4 groups of "
                  f"{qat.group_size}): the weights here are full precision, meant for `recipeforge export RUN_DIR "
                  f"--format {export_format(qat.scheme)}`.", ""]
    lines += _prompt_format(recipe)
    if reward:
        lines += _reward_usage(adapter)
    else:
        lines += _usage(adapter)
    lines += _results(run_dir, reward)
    lines += eval_section(run_dir)
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


def _prompt_format(recipe) -> list[str]:
    """What prompt the model was trained on, when its rows were written with a text prompt (not a chat
    template): users must send the same one."""
    from recipeforge.components.text_prompt import chat_template, render

    specs = recipe.data.datasets
    prompts = list(dict.fromkeys(d.prompt for d in specs if getattr(d, "prompt", None) is not None))
    if not prompts:
        return []
    # As `LMStage`: the saved tokenizer writes the prompt when every dataset has it and no template is named.
    templated = (len(prompts) == 1 and all(getattr(d, "prompt", None) is not None for d in specs)
                 and recipe.data.chat_template == "tokenizer" and chat_template(prompts[0], bos=False) is not None)
    lines = ["## Prompt format", "", ("Trained on rows written with this prompt (not a chat template); the reply "
                                      "follows it and ends with EOS."
                                      + (" The tokenizer's chat template writes it for a user message."
                                         if templated else "")) if len(prompts) == 1 else
             "Trained on rows written with these prompts (not a chat template):", ""]
    for prompt in prompts:
        example, _ = render(prompt, {"instruction": "{instruction}", "output": ""})
        lines += ["```text", example, "```", ""]
    return lines


def _usage(adapter: bool) -> list[str]:
    lines = ["## Usage", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
    if adapter:
        lines += ["# final/ holds the adapter; merged/ (if written) the merged model",
                  "from peft import AutoPeftModelForCausalLM",
                  "model = AutoPeftModelForCausalLM.from_pretrained(\"final\")"]
    else:
        lines += ["model = AutoModelForCausalLM.from_pretrained(\"final\")"]
    return lines + ["tokenizer = AutoTokenizer.from_pretrained(\"final\")", "```", ""]


def _reward_usage(adapter: bool) -> list[str]:
    where = ("# final/ holds the adapter and the score head (transformers loads the base it names); "
             "merged/ (if written) the merged model\n" if adapter else "")
    return ["## Usage", "", "```python", "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
            "", f"{where}model = AutoModelForSequenceClassification.from_pretrained(\"final\")",
            "tokenizer = AutoTokenizer.from_pretrained(\"final\")",
            "score = model(**tokenizer(prompt + answer + tokenizer.eos_token, return_tensors=\"pt\")).logits[0, 0]",
            "```", "", "As a GRPO reward: `grpo.rewards: [{name: reward_model, args: {path: <this run>/final}}]`.", ""]


def _text(value) -> str | None:
    """A card-worthy string, or None for a missing or redacted one."""
    return value if isinstance(value, str) and value and not value.startswith("<redacted") else None


def _results(run_dir: Path, reward: bool = False) -> list[str]:
    records = read_metrics(run_dir / "metrics.jsonl")
    rows = []
    # A reward model's trainer logs how often chosen outscores rejected, and by how much, unprefixed.
    pairs = (("accuracy", "pair accuracy", "train"), ("margin", "score margin", "train"),
             ("eval_accuracy", "eval pair accuracy", "eval"), ("eval_margin", "eval score margin", "eval"))
    for key, label, split in (("loss", "train loss", "train"), ("eval_loss", "eval loss", "eval"),
                              ("rewards/accuracies", "reward accuracy", "train"),
                              ("rewards/margins", "reward margin", "train"), ("reward", "mean reward", "train"),
                              *(pairs if reward else ())):
        values = series(records, key, split)
        if values:
            rows.append(f"| {label} | {values[0]:.4g} | {values[-1]:.4g} |")
    # The loss plot `train` writes next to this card (RUN_DIR/loss.png), linked relative to the card.
    plot = ["![Training loss](loss.png)", ""] if (run_dir / "loss.png").is_file() else []
    if not rows:
        return ["## Results", "", *plot] if plot else []
    return ["## Results", "", "| metric | first | last |", "|---|---|---|", *rows, "", *plot]


def write_model_card(path: Path, **kwargs) -> None:
    path.write_text(render_model_card(**kwargs))


# The evaluation section sits between these markers, so `recipeforge eval` can replace it in a card
# written at the end of training without the recipe and plan that card was rendered from.
EVAL_START, EVAL_END = "<!-- recipeforge:eval -->", "<!-- /recipeforge:eval -->"


def eval_section(run_dir: Path) -> list[str]:
    """The card's "## Evaluation" lines from RUN_DIR/eval/*.json; none before the run is evaluated."""
    from recipeforge.tools.evaluation.results import markdown_table, read_results

    results = read_results(run_dir)
    table = markdown_table(results)
    if not table:
        return []
    versions = next(iter(results.values())).get("versions") or {}
    return [EVAL_START, "## Evaluation", "", *table, "",
            f"lm-evaluation-harness {versions.get('lm_eval')} (`recipeforge eval`; details and prompt "
            "fingerprints in eval/<task>.json).", EVAL_END, ""]


def update_eval_section(readme: Path, run_dir: Path) -> None:
    """Replace (or add, before "## Data" or "## Plan") the evaluation section of an existing card."""
    text = readme.read_text(encoding="utf-8")
    block = "\n".join(eval_section(run_dir))
    if EVAL_START in text and EVAL_END in text:
        head, rest = text.split(EVAL_START, 1)
        tail = rest.split(EVAL_END, 1)[1].lstrip("\n")
        text = head + block + tail
    else:
        at = next((text.index(h) for h in ("\n## Data\n", "\n## Plan\n") if h in text), len(text))
        text = text[:at + 1] + block + text[at + 1:] if at < len(text) else text.rstrip("\n") + "\n\n" + block
    readme.write_text(text, encoding="utf-8")
