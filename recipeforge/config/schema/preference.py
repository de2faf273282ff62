"""Sections of the reference-free and unpaired preference stages: `orpo:`, `kto:` and `cpo:`.

ORPO and CPO (with its SimPO loss) train on prompt/chosen/rejected pairs without a reference model;
KTO trains on unpaired completions marked desirable or not, against a reference model.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from recipeforge.config.schema.base import Section

_PROMPT_LENGTH = "Truncate prompts to this many tokens (recipeforge keeps the end of each prompt)."


class ORPOConfig(Section):
    """Odds Ratio Preference Optimization (TRL ORPOTrainer): SFT loss plus an odds-ratio term, no reference model."""

    beta: float = Field(0.1, gt=0, description="Weight of the odds-ratio term against the NLL loss (the ORPO "
                                               "paper's lambda).")
    max_prompt_length: Optional[int] = Field(None, gt=0, description=_PROMPT_LENGTH)


class KTOConfig(Section):
    """Kahneman-Tversky Optimization (TRL KTOTrainer) on completions labelled desirable or undesirable.
    Micro batches hold 2 or more rows (the KL estimate pairs each prompt with another row's completion):
    a smaller `train.micro_batch_size` is refused, and `auto` never chooses one."""

    beta: float = Field(0.1, gt=0, description="Strength of the KL penalty towards the reference model.")
    desirable_weight: float = Field(
        1.0, gt=0, description="Weight of the loss on desirable completions; raise it when they are the fewer "
                               "(the KTO paper keeps desirable_weight x desirable rows / (undesirable_weight x "
                               "undesirable rows) between 1 and 4/3).")
    undesirable_weight: float = Field(1.0, gt=0, description="Weight of the loss on undesirable completions.")
    reference: str = Field(
        "auto", min_length=1,
        description="Reference model: `auto` (the base model; with an adapter, the base with adapters disabled) "
                    "or a path/hub id.")
    max_prompt_length: Optional[int] = Field(None, gt=0, description=_PROMPT_LENGTH)


class CPOConfig(Section):
    """Contrastive Preference Optimization (TRL CPOTrainer), no reference model; `loss_type: simpo` is SimPO.

    SimPO rewards are length-normalized log-probabilities, trained towards a margin `simpo_gamma`."""

    beta: float = Field(0.1, gt=0, description="Temperature of the preference loss (the SimPO paper uses 2.0-2.5).")
    loss_type: Literal["sigmoid", "hinge", "ipo", "simpo"] = Field(
        "sigmoid", description="Preference loss: sigmoid (CPO), hinge, ipo, or simpo (SimPO).")
    simpo_gamma: float = Field(0.5, ge=0, description="SimPO target reward margin (loss_type simpo only).")
    cpo_alpha: Optional[float] = Field(
        None, ge=0, description="Weight of the NLL term on chosen answers; default 1.0, and 0 for loss_type simpo "
                                "(pure SimPO, as in its paper).")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="Conservative label smoothing (sigmoid and "
                                                                   "simpo losses).")
    max_prompt_length: Optional[int] = Field(None, gt=0, description=_PROMPT_LENGTH)

    @model_validator(mode="after")
    def _smoothing_needs_a_sigmoid_loss(self) -> "CPOConfig":
        # TRL ignores label_smoothing for hinge and ipo with only a log warning: say so up front.
        if self.label_smoothing and self.loss_type in ("hinge", "ipo"):
            raise ValueError(f"label_smoothing applies to the sigmoid and simpo losses, not {self.loss_type}; "
                             f"remove label_smoothing or change loss_type")
        return self

    @property
    def nll_weight(self) -> float:
        """The NLL weight given to TRL (cpo_alpha): as set, else 0 for SimPO and 1 for the other losses."""
        if self.cpo_alpha is not None:
            return self.cpo_alpha
        return 0.0 if self.loss_type == "simpo" else 1.0
