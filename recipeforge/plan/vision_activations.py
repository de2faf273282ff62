"""Bytes a vision-language model's image side keeps for backward (`memory.estimate`'s
``vision_activations``), per image and per micro batch.

A vision tower whose parameters do not train runs with no input needing a gradient, so autograd
saves nothing in it: a frozen tower costs its forward's temporaries only, freed before the language
model runs, and no activation term. What trains keeps, per token (patch) of one ViT layer, what a
text layer keeps (`activations.layer_activation_parts`) at the tower's width: each norm's fp32 input
and, with trainable weights, its normalised tensor and output; q, k, v and the fused attention
kernel's output with its fp32 log-sum-exp per head (windowed or not, fused kernels keep no score
matrix); the MLP's inputs and intermediate tensors; LoRA's inputs. The projector keeps the inputs
of its linears and of the activation between them; Mllama's cross-attention layers keep keys and
values over every vision token. These tensors live from the vision forward, before the language
model's, to the end of backward, so they add to every moment of the train phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipeforge.plan.workload import Workload


@dataclass(frozen=True)
class VisionActivations:
    """Bytes kept for backward by one image, by part."""

    tower: float = 0.0
    projector: float = 0.0
    cross_attention: float = 0.0

    @property
    def total(self) -> float:
        return self.tower + self.projector + self.cross_attention


def images_per_micro_batch(w: Workload, micro_batch: int) -> int:
    """Images one forward pass encodes: every sequence of a sample (DPO's chosen and rejected) has them."""
    return micro_batch * w.sequences_per_sample * w.vision.images_per_sample if w.vision else 0


def vision_activation_bytes(w: Workload, micro_batch: int, checkpointing: bool) -> float:
    """Vision activations one micro batch keeps for backward (0 for a text-only model)."""
    if w.vision is None:
        return 0.0
    return images_per_micro_batch(w, micro_batch) * per_image(w, checkpointing).total


def per_image(w: Workload, checkpointing: bool) -> VisionActivations:
    """`VisionActivations` of one image at the planned resolution. With recomputation (which
    transformers' gradient checkpointing applies to the ViT blocks as to the decoder layers) each
    ViT layer keeps only its input; the layer recomputed in backward runs after the language model's
    backward has freed its activations, so it is not counted at the peak."""
    v = w.vision
    assert v is not None  # a vision-language model's workload
    spec, c = v.spec, w.compute_bytes
    patches = v.image.patches
    tower = 0.0
    if v.train_tower:
        per_layer = c * spec.hidden_size if checkpointing else vit_layer_bytes(w)
        # the patch embedding keeps its pixel input for its weight gradient when it trains in full
        pixels = c * spec.patch_values if w.full_finetune else 0
        tower = patches * (spec.depth * per_layer + pixels)
    projector = spec.projector_rows(v.image) * projector_row_bytes(w) if v.grads_reach_vision else 0.0
    cross = 0.0
    if spec.cross_attention_layers:
        # keys and values of every vision token in each cross-attention layer, and the image
        # states they are projected from (one tensor, shared by the layers)
        m = w.model
        layers = 0 if checkpointing else spec.cross_attention_layers
        cross = patches * c * (layers * 2 * m.kv_dim + m.hidden_size)
    return VisionActivations(tower=tower, projector=projector, cross_attention=cross)


def vit_layer_bytes(w: Workload) -> float:
    """Per patch, what one trained ViT layer keeps for backward (no recomputation)."""
    v = w.vision
    assert v is not None  # a vision-language model's workload
    spec, c, h = v.spec, w.compute_bytes, v.spec.hidden_size
    weights_train = w.full_finetune  # with LoRA the tower's base weights stay frozen
    norms = 2 * (4 * h + (2 * c * h if weights_train else 0))
    attention = c * 3 * h + c * h + 4 * spec.num_heads
    i = spec.intermediate_size
    if spec.gated_mlp:
        mlp = c * i * (4 if weights_train else 3)  # gate and up outputs, the activation, the product
    else:
        mlp = 2 * c * i                            # fc1's output and the activation's
    per_in = c + (1 if w.lora_dropout > 0 else 0)
    lora = sum(lin.count * (per_in * lin.in_features + c * w.lora_rank) for lin in v.tower_lora)
    return norms + attention + mlp + lora


def projector_row_bytes(w: Workload) -> float:
    """Per projector row (an LLM token's worth of merged patches), the inputs of the projector's
    linears and the activation's input between them; the norm ahead of them keeps its fp32 input
    only when a gradient passes it (a trained tower below) or its own weight trains (full fine-tune)."""
    v, c = w.vision, w.compute_bytes
    assert v is not None  # a vision-language model's workload
    spec = v.spec
    inputs = sum(lin.in_features for lin in spec.projector_linears)
    norm_keeps = v.train_tower or (v.train_projector and w.full_finetune)
    return c * (inputs + spec.projector_hidden) + (4 * spec.projector_norm if norm_keeps else 0)
