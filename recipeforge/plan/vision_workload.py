"""A recipe's images reduced to numbers (`VisionLoad`): how many per sample, at which resolution,
which parts of the vision side train and which of their linears carry adapters.

Read from `model.vision` for a model whose config has a vision tower the planner knows
(`plan.vision`); `workload.build_workload` attaches it to the `Workload`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from recipeforge.plan.linear import Linear
from recipeforge.plan.vision import ImageTokens, VisionSpec

if TYPE_CHECKING:
    from recipeforge.config.schema.adapter import AdapterConfig
    from recipeforge.config.schema.model import VisionConfig


@dataclass(frozen=True)
class VisionLoad:
    """The vision side of one training sample."""

    spec: VisionSpec
    images_per_sample: int
    image: ImageTokens                       # one image at the planned resolution
    train_tower: bool
    train_projector: bool
    tower_lora: tuple[Linear, ...] = ()      # one ViT layer's linears with adapters (LoRA + train_tower)
    projector_lora: tuple[Linear, ...] = ()  # projector linears with adapters (LoRA + train_projector)
    tower_targets: tuple[Linear, ...] = ()   # what target_modules would adapt in the tower, were it trained

    def with_tower_trained(self) -> "VisionLoad":
        """This load with the tower trained (for the plan's what-if), adapters where LoRA would put them."""
        return replace(self, train_tower=True, tower_lora=self.tower_targets)

    @property
    def image_tokens_per_sample(self) -> int:
        """Tokens a sample's images take in the language model's sequence (0 for cross-attention models)."""
        return self.images_per_sample * self.image.llm_tokens if self.spec.in_sequence else 0

    @property
    def grads_reach_vision(self) -> bool:
        """Whether backward runs into the vision side (otherwise it keeps nothing for backward)."""
        return self.train_tower or self.train_projector

    def full_trainable_params(self) -> int:
        """Parameters a full fine-tune trains on the vision side (frozen parts stay as loaded)."""
        return (self.spec.tower_params if self.train_tower else 0) + \
            (self.spec.projector_params if self.train_projector else 0)

    def adapter_params(self, rank: int, dora: bool = False) -> int:
        """LoRA parameters on the vision side: r x (in + out) per adapted linear (tower linears in
        every ViT layer), plus DoRA's magnitudes."""
        def per(linears: tuple[Linear, ...]) -> int:
            n = sum(lin.count * rank * (lin.in_features + lin.out_features) for lin in linears)
            return n + (sum(lin.count * lin.out_features for lin in linears) if dora else 0)

        return self.spec.depth * per(self.tower_lora) + per(self.projector_lora)


def build_vision_load(vision_cfg: VisionConfig, spec: VisionSpec, adapter: AdapterConfig,
                      notes: list[str]) -> VisionLoad:
    """The `VisionLoad` of a recipe's `model.vision` section for the tower `spec`; appends to `notes`
    what the estimate assumes."""
    max_pixels = vision_cfg.max_pixels
    if not spec.dynamic and (vision_cfg.max_pixels or vision_cfg.min_pixels):
        tiles = f" (up to {spec.tiles} tiles)" if spec.tiles > 1 else ""
        notes.append(f"model.vision min/max_pixels do not apply to {spec.family}: its processor resizes every "
                     f"image to {spec.image_size}x{spec.image_size}{tiles}")
        max_pixels = None
    image = spec.image_tokens(max_pixels)
    # LoRA reaches the tower only when it trains; with it, the projector's linears all get adapters
    lora = adapter.type != "none"
    targets = _tower_targets(spec, adapter.target_modules) if lora else ()
    return VisionLoad(spec=spec, images_per_sample=vision_cfg.images_per_sample, image=image,
                      train_tower=vision_cfg.train_tower, train_projector=vision_cfg.train_projector,
                      tower_lora=targets if vision_cfg.train_tower else (),
                      projector_lora=spec.projector_linears if lora and vision_cfg.train_projector else (),
                      tower_targets=targets)


def _tower_targets(spec: VisionSpec, target_modules: str | tuple[str, ...]) -> tuple[Linear, ...]:
    """The ViT linears a LoRA `target_modules` setting reaches: all of them for ``all-linear``, else
    those whose module name is listed (peft matches the last part of a module's name)."""
    if target_modules == "all-linear":
        return spec.layer_linears
    wanted = {name.rsplit(".", 1)[-1] for name in target_modules}
    return tuple(lin for lin in spec.layer_linears if lin.name in wanted)
