"""Added tokens: special tokens, extra vocabulary, turn-end tokens, and the embedding rows they need.

`prepare_tokenizer` applies `model.special_tokens`, `model.tokens`, `model.eot_tokens` and the special
tokens of the chat template to the tokenizer, and says which ids are new. `fit_model` then gives
the model a row for each (mean of the existing rows, the usual start for a new token) and makes
the turn-end tokens stop generation; `trainable_tokens` names the rows a LoRA run must train
(peft's ``trainable_token_indices``), since LoRA alone would leave them at their first value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class VocabChange:
    """What `prepare_tokenizer` did: new token ids (rows to add/initialise/train) and turn-end ids."""

    new_ids: tuple[int, ...] = ()
    new_tokens: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()     # turn-end tokens besides EOS: generation stops at them too

    def describe(self) -> str:
        shown = ", ".join(self.new_tokens[:8]) + (" ..." if len(self.new_tokens) > 8 else "")
        return f"added {len(self.new_ids)} token(s) to the tokenizer ({shown})" if self.new_ids else ""


def prepare_tokenizer(tokenizer, recipe, *, base_dir: Path | None = None,
                      locate: Callable[[tuple], Any] = lambda path: None) -> VocabChange:
    """Install `data.chat_template` and the recipe's tokens into `tokenizer`; what changed."""
    from recipeforge.components.chat_templates import resolve
    from recipeforge.components.tokenizer import add_tokens, set_chat_template

    m = recipe.model
    before = len(tokenizer)
    where = locate(("data", "chat_template"))
    set_chat_template(tokenizer, recipe.data.chat_template, required=False, location=where, base_dir=base_dir)
    resolved = resolve(recipe.data.chat_template, base_dir=base_dir, location=where)
    special = {k: getattr(m.special_tokens, k) for k in SPECIAL_KEYS if getattr(m.special_tokens, k)}
    if special:
        from tokenizers import AddedToken

        tokenizer.add_special_tokens({k: AddedToken(v, normalized=False, special=True) for k, v in special.items()})
    add_tokens(tokenizer, special=tuple(m.eot_tokens), plain=tuple(m.tokens))
    eots = [*m.eot_tokens, *([resolved.eot] if resolved is not None and resolved.eot else [])]
    stop = tuple(dict.fromkeys(tokenizer.convert_tokens_to_ids(t) for t in eots))
    new = tuple(range(before, len(tokenizer)))
    return VocabChange(new, tuple(tokenizer.convert_ids_to_tokens(list(new))),
                       tuple(i for i in stop if i is not None and i != tokenizer.eos_token_id))


def fit_model(model, tokenizer, change: Optional[VocabChange]) -> None:
    """Give the model an embedding row for every token of the tokenizer, start the new tokens' rows
    (input and, when untied, output) at the mean of the other rows, and stop generation at the
    turn-end tokens too."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    new = [i for i in (change.new_ids if change else ()) if i < model.get_input_embeddings().weight.shape[0]]
    if new:
        _mean_rows(model, new)
    gen = getattr(model, "generation_config", None)
    if change and change.stop_ids and gen is not None:
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else \
            [gen.eos_token_id] if gen.eos_token_id is not None else []
        gen.eos_token_id = list(dict.fromkeys([*eos, *change.stop_ids]))


def _mean_rows(model, ids: list[int]) -> None:
    import torch

    weights = [model.get_input_embeddings().weight]
    out = model.get_output_embeddings()
    if out is not None and out.weight is not weights[0]:
        weights.append(out.weight)
    keep = torch.ones(weights[0].shape[0], dtype=torch.bool)
    keep[ids] = False
    for w in weights:
        with _gathered(w), torch.no_grad():
            w[ids] = w[keep[: w.shape[0]]].float().mean(dim=0).to(w.dtype)


def _gathered(weight):
    """ZeRO-3 partitions weights at load: gather the whole matrix to write rows of it."""
    import contextlib

    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
    except ImportError:  # pragma: no cover - transformers always has it
        return contextlib.nullcontext()
    if not is_deepspeed_zero3_enabled():
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([weight], modifier_rank=0)


def trainable_tokens(model, change: Optional[VocabChange], modules_to_save=()) -> dict[str, list[int]] | None:
    """peft ``trainable_token_indices`` that train the new tokens' rows under LoRA: the input
    embeddings, and the output layer when it is not tied to them (peft ties a tied one itself).
    A module already trained in full (`adapter.modules_to_save`) needs none."""
    if change is None or not change.new_ids:
        return None
    names = {id(mod): name.rsplit(".", 1)[-1] for name, mod in model.named_modules()}
    ids = list(change.new_ids)
    targets: dict[str, list[int]] = {}
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if names.get(id(inp)) and names[id(inp)] not in modules_to_save:
        targets[names[id(inp)]] = ids
    tied = out is not None and out.weight is inp.weight
    if out is not None and not tied and names.get(id(out)) and names[id(out)] not in modules_to_save:
        targets[names[id(out)]] = ids
    return targets or None


@dataclass(frozen=True)
class TokenRequest:
    """The tokens a recipe asks for (for the plan: known without loading the tokenizer)."""

    explicit: tuple[str, ...] = field(default_factory=tuple)
    template: tuple[str, ...] = field(default_factory=tuple)


def requested_tokens(recipe) -> TokenRequest:
    """Tokens `model.special_tokens`, `model.tokens`, `model.eot_tokens` and the named chat template name."""
    from recipeforge.components.chat_templates import TEMPLATES, canonical

    m = recipe.model
    special = [getattr(m.special_tokens, k) for k in SPECIAL_KEYS if getattr(m.special_tokens, k, None)]
    explicit = tuple(dict.fromkeys([*special, *m.tokens, *m.eot_tokens]))
    name = canonical(recipe.data.chat_template)
    template = tuple(t for t in (*TEMPLATES[name].special, *TEMPLATES[name].plain) if t not in explicit) \
        if name else ()
    return TokenRequest(explicit, template)
