"""The trainable parameters of `train.unfrozen_parameters`, counted from the model's config.

The planner has no weights: it matches the patterns against the parameter names transformers
would build (`param_layout.parameter_layout`) and sums the sizes of the selected ones, so
gradients and optimizer states are planned for those parameters only.
"""

from __future__ import annotations

from recipeforge.config.param_patterns import examples, parse_pattern, selected
from recipeforge.errors import Problem, RecipeError
from recipeforge.plan.models import DECODER_LAYER_CLASS, ModelSpec, human_count
from recipeforge.plan.param_layout import parameter_layout

KEY = "train.unfrozen_parameters"


def check_adapter(patterns: list[str] | None, adapter_type: str) -> None:
    """Refuse patterns next to a LoRA/QLoRA adapter: peft freezes the base model and saves only the
    adapter (plus `modules_to_save`), so base weights trained this way would be silently lost."""
    if patterns and adapter_type != "none":
        raise RecipeError(f"{KEY} trains base-model parameters in full, which adapter.type {adapter_type} "
                          f"freezes and does not save", key=KEY,
                          hint="set adapter.type: none for a partial full fine-tune, or list whole modules "
                               "under adapter.modules_to_save to train them next to the adapter")


def unfrozen_count(spec: ModelSpec, patterns: list[str]) -> tuple[int, list[str]]:
    """(trainable parameters, notes) of `patterns` on `spec`. A pattern that selects no parameter is
    an error for the architectures whose names are known; for others (counted as Llama-style) it is
    a note, and the run checks the real names when the model is loaded."""
    compiled = [parse_pattern(p) for p in patterns]
    layout = parameter_layout(spec)
    names = [n for n, _ in layout]
    chosen, unused = selected(compiled, names)
    notes: list[str] = []
    if unused:
        # A vision-language model's tower and projector are not laid out: a pattern may select them.
        known = spec.model_type in DECODER_LAYER_CLASS and spec.vision is None
        listed = ", ".join(f"[{i}] {patterns[i]!r}" for i in unused)
        if known:
            raise RecipeError([Problem(f"{KEY}[{i}] {patterns[i]!r} selects no parameter of {spec.model_type} "
                                       f"(patterns match from the start of the name)", key=f"{KEY}[{i}]",
                                       hint=f"parameter names look like: {examples(names)}") for i in unused])
        laid_out = "language model" if spec.vision is not None else "Llama-style layout assumed for"
        notes.append(f"{KEY} {listed} select no parameter of the {laid_out} '{spec.model_type}' "
                     f"(counted as frozen here); the run checks them against the loaded model")
    sizes = dict(layout)
    count = sum(sizes[n] for n in chosen)
    notes.append(f"{KEY}: {len(chosen)} of {len(names)} parameter tensors train "
                 f"({human_count(count)} of {human_count(spec.total_params())} parameters); the rest are frozen")
    return count, notes


def unfrozen_kinds(spec: ModelSpec, patterns: list[str]) -> frozenset[str]:
    """Which kinds of weight `patterns` train: ``linear`` (a decoder layer's projections or the output
    layer) and ``norm`` (the norms). They decide what autograd keeps for backward: a frozen linear keeps
    no input for a weight gradient, a frozen norm no normalised tensor (`activations`)."""
    names = [n for n, _ in parameter_layout(spec)]
    chosen, _ = selected([parse_pattern(p) for p in patterns], names)
    return frozenset(kind for n in chosen if (kind := weight_kind(n)))


def weight_kind(name: str) -> str | None:
    """``norm``, ``linear`` or None (embeddings, biases of neither) for a parameter name."""
    module = name.rsplit(".", 1)[0]
    if "norm" in module.rsplit(".", 1)[-1]:
        return "norm"
    if name.endswith(".weight") and (module.endswith("_proj") or module.endswith("lm_head")):
        return "linear"
    if ".experts." in name:  # routed experts stored as one fused tensor per projection (transformers 5)
        return "linear"
    return None
