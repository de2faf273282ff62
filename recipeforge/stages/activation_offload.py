"""`train.activation_offloading`: the activations saved for backward go to pinned host memory during
the forward pass and come back for backward (TRL's `OffloadActivations` saved-tensor hooks).

TRL's SFT, DPO, KTO and reward configs have an ``activation_offloading`` field and wrap their own
training step; the pretrain and sft stages run the plain transformers Trainer, whose training step
is wrapped here with the same context manager, exactly as TRL's SFTTrainer does. GRPO generates
inside its training step, and the experimental ORPO/CPO trainers have no such field: those stages
refuse it. TRL's offloading moves tensors off an accelerator only (its hooks keep CPU tensors where
they are, and it asks ``torch.accelerator`` for the device, None without one), so a CPU run refuses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stage_specs import stage_spec, stages_with
from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    from transformers import Trainer

KEY = "train.activation_offloading"


def check_activation_offloading(stage: str, device: str, *, location: Location | None = None) -> None:
    """Refuse `train.activation_offloading` where it cannot run: a stage without it
    (`StageSpec.activation_offload`), or a CPU run."""
    if not stage_spec(stage).activation_offload:
        raise RecipeError(f"activation offloading is not available for the {stage} stage", key=KEY,
                          location=location, hint=f"it runs for {', '.join(stages_with('activation_offload'))}; "
                                              f"set {KEY}: false")
    if device != "cuda":
        raise RecipeError("activation offloading moves activations from a GPU to host memory, and this run is "
                          f"planned for the {device}", key=KEY, location=location, hint=f"set {KEY}: false")


def trainer_field(cls: type) -> dict[str, bool]:
    """``{"activation_offloading": True}`` when the trainer's config class `cls` has TRL's field, else {}."""
    return {"activation_offloading": True} if "activation_offloading" in getattr(cls, "__dataclass_fields__", {}) \
        else {}


def wrap_training_step(trainer: Trainer) -> None:
    """Run every training step of `trainer` (a Trainer whose arguments lack TRL's field) inside TRL's
    offloading context, built for its model as TRL's own trainers build it."""
    if getattr(trainer.args, "activation_offloading", False):
        return  # the trainer does it itself
    from trl.models.activation_offloading import get_act_offloading_ctx_manager

    context = get_act_offloading_ctx_manager(model=trainer.model)
    step = trainer.training_step

    def training_step(*args: Any, **kwargs: Any) -> Any:
        with context:
            return step(*args, **kwargs)

    trainer.training_step = training_step
    trainer.activation_offload_context = context
