"""Kahneman-Tversky Optimization on TRL's `KTOTrainer`.

KTO learns from single completions marked desirable or undesirable (the `unpaired` format); a
`preference` dataset is unpaired first (chosen: desirable, rejected: undesirable). The reference
model is handled as for DPO: with an adapter it is the base with adapters disabled, for full
fine-tuning a second copy of the starting model, or the model `kto.reference` names.

TRL estimates KTO's KL term from each row's prompt paired with a neighbour's completion in the same
micro batch, so it reads the rows in order (sequential sampling) and needs micro batches of two or
more rows; recipeforge shuffles the rows once, with `train.seed`, when `data.shuffle` is on.
"""

from __future__ import annotations

from recipeforge.errors import RecipeError
from recipeforge.stages.trl_preference import PreferenceTrainerStage


def unpaired_rows(ds, fmt):
    """Rows of an `unpaired` dataset as they are; a preference dataset's pairs as two rows each,
    the chosen answer desirable (label true) and the rejected one undesirable, kept next to each other."""
    if fmt.kind != "preference":
        return ds
    if "prompt" not in ds.column_names:  # the prompt is the conversation both answers share
        from trl.data_utils import maybe_extract_prompt

        ds = ds.map(maybe_extract_prompt)

    def unpair(batch):
        out: dict[str, list] = {"prompt": [], "completion": [], "label": []}
        for prompt, chosen, rejected in zip(batch["prompt"], batch["chosen"], batch["rejected"]):
            out["prompt"] += [prompt, prompt]
            out["completion"] += [chosen, rejected]
            out["label"] += [True, False]
        return out

    return ds.map(unpair, batched=True, remove_columns=ds.column_names)


def check_labels(rows, data, locate) -> None:
    """KTO needs desirable and undesirable completions among the training rows."""
    labels = set(rows["label"])
    if len(labels) > 1:
        return
    kind = "desirable (label true)" if True in labels else "undesirable (label false)"
    missing = "false" if True in labels else "true"
    one = len(data.datasets) == 1
    raise RecipeError(f"KTO needs desirable and undesirable completions, but every training row is {kind}",
                      key="data.datasets[0]" if one else "data.datasets",
                      location=locate(("data", "datasets", 0, "path") if one else ("data", "datasets")),
                      hint=f"add rows with label {missing}, or train on preference pairs (format: preference), "
                           f"whose rejected answers become undesirable rows")


class KTOStage(PreferenceTrainerStage):
    """KTO on prompt/completion/label rows (or unpaired preference pairs)."""

    stage = "kto"
    method = "KTO"
    trainer_class = "trl.KTOTrainer"

    def prepare_data(self) -> None:
        from recipeforge.components.data import format_rows, load_split, truncate_prompts
        from recipeforge.components.formats import RenderOptions
        from recipeforge.components.tokenizer import set_chat_template

        self._check_micro_batch()
        data, seed = self.recipe.data, self.recipe.train.seed
        set_chat_template(self.tokenizer, data.chat_template, required=False,
                          location=self.ctx.locate(("data", "chat_template")))
        opts = RenderOptions(self.tokenizer)
        train, evaluation, stats = load_split(
            data, ("unpaired", "preference"), seed=seed, base_dir=self.ctx.base_dir, locate=self.ctx.locate,
            transform=lambda ds, fmt: unpaired_rows(format_rows(ds, opts), fmt))
        check_labels(train, data, self.ctx.locate)
        stats["desirable_rows"] = sum(train["label"])
        stats["undesirable_rows"] = len(train) - stats["desirable_rows"]
        max_prompt = self.section.max_prompt_length
        if max_prompt:
            train, stats["prompts_truncated"] = truncate_prompts(train, self.tokenizer, max_prompt)
            if evaluation is not None:
                evaluation, _ = truncate_prompts(evaluation, self.tokenizer, max_prompt)
        if data.shuffle:  # the trainer samples in order (see the module docstring)
            train = train.shuffle(seed=seed)
        if isinstance(train[0]["prompt"], list) and not getattr(self.tokenizer, "chat_template", None):
            set_chat_template(self.tokenizer, data.chat_template, required=True,
                              location=self.ctx.locate(("data", "chat_template")))
        self.train_rows, self.eval_rows = train, evaluation
        self.has_eval = evaluation is not None
        self.data_stats = stats
        self.ctx.log("data: " + ", ".join(f"{k}={v}" for k, v in stats.items()))

    def _check_micro_batch(self) -> None:
        plan = self.ctx.plan
        if plan is not None and plan.micro_batch_size < 2:
            raise RecipeError(f"KTO needs micro batches of 2 or more rows (its KL estimate pairs each prompt with "
                              f"another row's completion); the plan has {plan.micro_batch_size}",
                              key="train.micro_batch_size", location=self.ctx.locate(("train", "micro_batch_size")),
                              hint="set train.micro_batch_size: 2 or more (a divisor of the per-GPU batch)")

    def method_arguments(self) -> dict:
        k = self.section
        return {"beta": k.beta, "desirable_weight": k.desirable_weight, "undesirable_weight": k.undesirable_weight,
                "train_sampling_strategy": "sequential"}

    def trainer_arguments(self) -> dict:
        return {"ref_model": self.reference_model()}
