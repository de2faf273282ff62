"""What a full fine-tune trains: `train.unfrozen_parameters` on the loaded model, and the check that
torchao's low-bit optimizers can run before anything loads."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from recipeforge.config.param_patterns import examples, parse_pattern, selected
from recipeforge.errors import Location, Problem, RecipeError

if TYPE_CHECKING:
    import torch

    from recipeforge.stages.context import Locate, Logger

KEY = "train.unfrozen_parameters"
TORCHAO_OPTIMIZERS = ("adamw_torchao_8bit", "adamw_torchao_4bit")


def apply_unfrozen_parameters(model: torch.nn.Module, patterns: list[str], *, locate: Locate | None = None,
                              log: Logger | None = None) -> tuple[int, int]:
    """Freeze every parameter of `model` except those a pattern selects (Axolotl's semantics, see
    `config.param_patterns`); a row range leaves the other rows' gradients at zero. A pattern that
    selects nothing is a `RecipeError` at its index, listing some real parameter names. Returns
    (trainable parameters, all parameters)."""
    compiled = [parse_pattern(p) for p in patterns]
    named = list(model.named_parameters())
    names = [n for n, _ in named]
    chosen, unused = selected(compiled, names)
    if unused:
        raise RecipeError([Problem(f"{patterns[i]!r} selects no parameter of the loaded model (patterns match "
                                   f"from the start of the name)",
                                   location=locate((*KEY.split("."), i)) if locate else None, key=f"{KEY}[{i}]",
                                   hint=f"parameter names look like: {examples(names)}") for i in unused])
    chosen_set = set(chosen)
    trainable = total = 0
    for name, param in named:
        total += param.numel()
        param.requires_grad_(name in chosen_set)
        if name not in chosen_set:
            continue
        trainable += param.numel()
        ranges = [p.rows for p in compiled if p.matches(name) and p.rows is not None]
        whole = any(p.matches(name) and p.rows is None for p in compiled)
        if ranges and not whole:
            _train_rows_only(param, ranges, name)
    if log is not None:
        log(f"unfrozen_parameters: {len(chosen)} of {len(names)} parameter tensors train "
            f"({trainable:,} of {total:,} parameters)")
    return trainable, total


def _train_rows_only(param: torch.nn.Parameter, ranges: list[tuple[int, int | None]], name: str) -> None:
    """Zero the gradient of every row outside `ranges` (Adam then leaves those rows unchanged; the
    schema refuses row ranges with weight decay, which would still shrink them)."""
    rows = param.shape[0]
    keep = [(lo, rows if hi is None else min(hi, rows)) for lo, hi in ranges]
    if any(lo >= hi for lo, hi in keep):
        raise RecipeError(f"a row range in {KEY} is outside {name}, which has {rows} rows", key=KEY,
                          hint=f"use ranges within [0:{rows}]")
    import torch

    mask = torch.zeros(rows, dtype=torch.bool, device=param.device)
    for lo, hi in keep:
        mask[lo:hi] = True
    frozen = ~mask

    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[frozen.to(grad.device)] = 0
        return grad

    param.register_hook(hook)  # type: ignore[no-untyped-call]  # unannotated in torch


def check_low_bit_optimizer(optimizer: str, *, location: Location | None = None) -> None:
    """Refuse torchao's low-bit AdamW when torchao (at the version transformers needs) is missing,
    before any data or weights load."""
    if optimizer not in TORCHAO_OPTIMIZERS:
        return
    hint = "pip install 'recipeforge[torchao]', or set train.optimizer: adamw_8bit (bitsandbytes) or adamw"
    if importlib.util.find_spec("torchao") is None:
        raise RecipeError(f"train.optimizer {optimizer} needs the torchao package, which is not installed",
                          key="train.optimizer", location=location, hint=hint)
    from transformers.utils import import_utils

    if not import_utils.is_torchao_available():
        need = getattr(import_utils, "TORCHAO_MIN_VERSION", "0.4.0")
        from importlib.metadata import version

        raise RecipeError(f"train.optimizer {optimizer} needs torchao >= {need} with this transformers; "
                          f"torchao {version('torchao')} is installed", key="train.optimizer", location=location,
                          hint=hint)
