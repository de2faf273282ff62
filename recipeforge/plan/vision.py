"""A vision-language model's image side as numbers: its vision tower, its projector, and how many
tokens an image becomes, read from a ``config.json`` without torch.

`vision_from_config` reads the ``vision_config`` of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA (CLIP or
SigLIP towers), Gemma 3 (SigLIP) and Mllama (Llama 3.2 Vision). Parameter counts are sums over the
modules transformers builds for each (`tests/unit/plan/test_plan_vision.py` compares them with the
models it builds on the meta device). Defaults are those of transformers' config classes, used when a
config.json leaves a key out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipeforge.plan.linear import Linear

# Qwen2-VL / Qwen2.5-VL image processor defaults: 56x56 to 28x28x1280 pixels.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 1280
# Qwen3-VL's processor works on 16-pixel patches merged 2x2 (32-pixel units): 2^16 pixels up to 2^24.
QWEN3_MIN_PIXELS = 65536
QWEN3_MAX_PIXELS = 16777216
# transformers' class of one ViT layer of each Qwen vision tower
QWEN_BLOCKS = {"qwen2_vl": "Qwen2VLVisionBlock", "qwen2_5_vl": "Qwen2_5_VLVisionBlock", "qwen3_vl": "Qwen3VLVisionBlock"}
# Mllama's default tiling: at most 4 tiles, these 8 aspect ratios (rows x columns of tiles).
_MLLAMA_RATIOS = 8


@dataclass(frozen=True)
class VisionSpec:
    """The shape of a vision tower (a ViT) and its projector into the language model."""

    family: str                       # qwen2_vl | qwen2_5_vl | qwen3_vl | llava | gemma3 | mllama
    depth: int                        # ViT layers (Mllama: local plus global layers)
    hidden_size: int                  # the ViT's width
    intermediate_size: int            # its MLP width
    num_heads: int
    gated_mlp: bool                   # SwiGLU MLP (Qwen2.5-VL) or fc1/act/fc2 (the others)
    patch_size: int
    patch_values: int                 # values one patch holds going into the patch embedding
    tower_params: int
    projector_params: int
    layer_linears: tuple[Linear, ...]       # the linears of one ViT layer
    projector_linears: tuple[Linear, ...]   # in call order (an activation between consecutive ones)
    projector_norm: int = 0           # per projector row, the width a norm ahead of it reads (0: none)
    projector_hidden: int = 0         # per projector row, the width of the activations between its linears
    other_linear_params: int = 0      # tower linears outside the layers (SigLIP's pooling head)
    merge: int = 1                    # Qwen: spatial_merge_size (merge^2 patches -> one LLM token)
    dynamic: bool = False             # Qwen: the image's resolution follows min/max_pixels
    min_pixels: int = 0               # the processor's defaults (dynamic towers)
    max_pixels: int = 0
    image_size: int = 0               # fixed-resolution towers: the side images are resized to
    tiles: int = 1                    # Mllama: tiles per image at most
    patches_per_tile: int = 0         # fixed towers: ViT tokens per tile (with a class token, padding)
    llm_tokens_fixed: int = 0         # fixed towers: tokens an image takes in the text sequence
    in_sequence: bool = True          # image tokens occupy the text sequence (Mllama: cross-attention)
    cross_attention_layers: int = 0   # Mllama: text layers attending to the image
    approximate: str = ""             # what the count leaves approximate, said in the plan
    block_class: str = ""             # transformers' class of one ViT layer (FSDP wraps each as a unit)

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params

    def projector_rows(self, image: "ImageTokens") -> int:
        """Rows one image passes through the projector: its LLM tokens, or (Mllama, whose images stay
        out of the text sequence) every vision token."""
        return image.llm_tokens if self.in_sequence else image.patches

    def layer_params(self) -> int:
        return sum(lin.params for lin in self.layer_linears)

    def linear_weight_params(self) -> int:
        """Weights of the tower's and projector's ``nn.Linear`` modules (what bitsandbytes quantizes)."""
        def weights(linears: tuple[Linear, ...]) -> int:
            return sum(lin.count * lin.in_features * lin.out_features for lin in linears)

        return self.depth * weights(self.layer_linears) + weights(self.projector_linears) + self.other_linear_params

    def image_tokens(self, max_pixels: int | None = None) -> "ImageTokens":
        """What one image becomes at the largest size the processor allows (`max_pixels`, default
        the processor's own): its pixels, the ViT's tokens (patches) and the LLM's tokens."""
        if self.dynamic:
            pixels = max_pixels or self.max_pixels
            unit = self.patch_size * self.merge  # Qwen resizes to multiples of patch x merge pixels
            llm = max(1, pixels // (unit * unit))
            return ImageTokens(pixels=llm * unit * unit, patches=llm * self.merge ** 2, llm_tokens=llm,
                               requested_pixels=pixels)
        pixels = self.tiles * self.image_size ** 2
        return ImageTokens(pixels=pixels, patches=self.tiles * self.patches_per_tile,
                           llm_tokens=self.llm_tokens_fixed, requested_pixels=pixels)


@dataclass(frozen=True)
class ImageTokens:
    """One image at the planned resolution."""

    pixels: int             # the area the processor resizes it to (a multiple of the patch grid)
    patches: int            # ViT tokens
    llm_tokens: int         # tokens it takes in the language model's sequence
    requested_pixels: int   # the max_pixels the plan sized it at


def vision_from_config(config: dict[str, Any], text_hidden: int) -> VisionSpec | None:
    """The `VisionSpec` of a vision-language ``config.json`` (None: no vision tower the planner knows).
    `text_hidden`: the language model's width, where a projector maps to it."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    model_type = str(config.get("model_type", ""))
    reader = _READERS.get(model_type)
    if reader is None:
        vt = str(vision.get("model_type", ""))
        reader = _READERS.get(vt.removesuffix("_vision").removesuffix("_vision_model"))
    return reader(config, vision, text_hidden) if reader is not None else None


def _ln(width: int) -> int:
    """A LayerNorm's parameters (weight and bias)."""
    return 2 * width


def _vit_layer(h: int, i: int, *, fused_qkv: bool, qkv_bias: bool = True, gated: bool = False,
               mlp_bias: bool = True) -> tuple[Linear, ...]:
    """One ViT layer's linears: attention (fused qkv or q/k/v/o) and the MLP."""
    attn: tuple[Linear, ...]
    mlp: tuple[Linear, ...]
    if fused_qkv:
        attn = (Linear("qkv", h, 3 * h, bias=qkv_bias), Linear("proj", h, h, bias=True))
    else:
        attn = tuple(Linear(n, h, h, bias=qkv_bias) for n in ("q_proj", "k_proj", "v_proj", "out_proj"))
    if gated:
        mlp = (Linear("gate_proj", h, i, bias=mlp_bias), Linear("up_proj", h, i, bias=mlp_bias),
               Linear("down_proj", i, h, bias=mlp_bias))
    else:
        mlp = (Linear("fc1", h, i, bias=mlp_bias), Linear("fc2", i, h, bias=mlp_bias))
    return attn + mlp


def _patch(vision: dict[str, Any], key: str, default: int) -> int:
    value = vision.get(key, default)
    return int(value[0] if isinstance(value, (list, tuple)) else value)


# ----------------------------------------------------------------------------- Qwen-VL

def _qwen2_vl(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """Qwen2-VL: `embed_dim` is the ViT's width, `hidden_size` the projector's output; LayerNorms and
    a QuickGELU fc1/fc2 MLP of embed_dim x mlp_ratio."""
    h = int(v.get("embed_dim", 1280))
    i = int(h * v.get("mlp_ratio", 4))
    out = int(v.get("hidden_size", text_hidden))
    return _qwen(v, "qwen2_vl", h, i, out, gated=False, layer_norms=2 * _ln(h), merger_norm=_ln(h),
                 patch_bias=False, positions=0, deepstack=0)


def _qwen2_5_vl(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """Qwen2.5-VL: RMSNorms and a biased SwiGLU MLP; window attention in all layers but
    `fullatt_block_indexes` (windows change no parameter and, with fused attention kernels, no
    activation per patch)."""
    h = int(v.get("hidden_size", 1280))
    return _qwen(v, "qwen2_5_vl", h, int(v.get("intermediate_size", 3420)), int(v.get("out_hidden_size", text_hidden)),
                 gated=True, layer_norms=2 * h, merger_norm=h, patch_bias=False, positions=0, deepstack=0)


def _qwen3_vl(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """Qwen3-VL: LayerNorms, fc1/fc2 MLP, a biased patch embedding, learned positions, and one extra
    merger per `deepstack_visual_indexes` entry (normalising after the merge) feeding early LLM layers."""
    h = int(v.get("hidden_size", 1152))
    return _qwen(v, "qwen3_vl", h, int(v.get("intermediate_size", 4304)), int(v.get("out_hidden_size", text_hidden)),
                 gated=False, layer_norms=2 * _ln(h), merger_norm=_ln(h), patch_bias=True,
                 positions=int(v.get("num_position_embeddings", 2304)),
                 deepstack=len(v.get("deepstack_visual_indexes", (8, 16, 24))),
                 default_patch=16, min_pixels=QWEN3_MIN_PIXELS, max_pixels=QWEN3_MAX_PIXELS)


def _qwen(v: dict[str, Any], family: str, h: int, i: int, out: int, *, gated: bool, layer_norms: int, merger_norm: int,
          patch_bias: bool, positions: int, deepstack: int, default_patch: int = 14,
          min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS) -> VisionSpec:
    """The Qwen-VL towers: a Conv3d patch embedding over temporal_patch_size frames (an image is
    repeated to fill them), `depth` blocks, and a merger that concatenates merge x merge patches and
    maps them through a two-layer MLP to the LLM's width."""
    depth = int(v.get("depth", 32))
    patch, temporal = _patch(v, "patch_size", default_patch), _patch(v, "temporal_patch_size", 2)
    merge = int(v.get("spatial_merge_size", 2))
    channels = int(v.get("in_channels", v.get("in_chans", 3)))
    patch_values = channels * temporal * patch * patch
    layer = _vit_layer(h, i, fused_qkv=True, gated=gated)
    wide = h * merge * merge
    merger = (Linear("mlp.0", wide, wide, bias=True), Linear("mlp.2", wide, out, bias=True))
    tower = (patch_values * h + (h if patch_bias else 0) + positions * h
             + depth * (sum(lin.params for lin in layer) + layer_norms))
    # Qwen3-VL's deepstack mergers normalise the merged (wide) features; all mergers are the projector
    projector = merger_norm + sum(lin.params for lin in merger) \
        + deepstack * (_ln(wide) + sum(lin.params for lin in merger))
    return VisionSpec(family=family, depth=depth, hidden_size=h, intermediate_size=i,
                      num_heads=int(v.get("num_heads", 16)), gated_mlp=gated, patch_size=patch,
                      patch_values=patch_values, tower_params=tower, projector_params=projector,
                      layer_linears=layer, projector_linears=merger * (1 + deepstack),
                      projector_norm=wide * (1 + deepstack), projector_hidden=wide * (1 + deepstack),
                      merge=merge, dynamic=True, min_pixels=min_pixels, max_pixels=max_pixels,
                      block_class=QWEN_BLOCKS[family])


# ----------------------------------------------------------------------------- fixed-resolution towers

@dataclass(frozen=True)
class _ViT:
    """A CLIP or SigLIP vision transformer as LLaVA and Gemma 3 build it."""

    siglip: bool
    hidden: int
    intermediate: int
    layers: int
    heads: int
    image: int
    patch: int
    layer: tuple[Linear, ...]
    params: int
    patches: int          # tokens per image (CLIP: with its class token)
    head_linears: int     # SigLIP's attention-pooling head's linear weights

    @property
    def block_class(self) -> str:
        return "SiglipEncoderLayer" if self.siglip else "CLIPEncoderLayer"


def _clip_or_siglip(v: dict[str, Any], default_type: str) -> _ViT:
    """The `_ViT` of a CLIP or SigLIP ``vision_config`` (transformers' defaults for missing keys)."""
    siglip = str(v.get("model_type", default_type)).startswith("siglip")
    h = int(v.get("hidden_size", 1024 if not siglip else 1152))
    i = int(v.get("intermediate_size", 4096 if not siglip else 4304))
    layers = int(v.get("num_hidden_layers", 24 if not siglip else 27))
    image, patch = _patch(v, "image_size", 336 if not siglip else 384), _patch(v, "patch_size", 14)
    channels = int(v.get("num_channels", 3))
    n = (image // patch) ** 2
    layer = _vit_layer(h, i, fused_qkv=False)
    per_layer = sum(lin.params for lin in layer) + 2 * _ln(h)
    head_linears = 0
    if siglip:
        # biased patch embedding, one position per patch, a final LayerNorm; the attention-pooling
        # head unless vision_use_head is off (Gemma 3 turns it off)
        tower = channels * patch * patch * h + h + n * h + layers * per_layer + _ln(h)
        if v.get("vision_use_head", True):
            tower += h + (3 * h * h + 3 * h) + (h * h + h) + _ln(h) + (h * i + i) + (i * h + h)
            head_linears = 3 * h * h + h * h + h * i + i * h
    else:
        # CLIP: a class token and its position, pre- and post-LayerNorm
        tower = h + channels * patch * patch * h + (n + 1) * h + _ln(h) + layers * per_layer + _ln(h)
        n += 1
    return _ViT(siglip=siglip, hidden=h, intermediate=i, layers=layers, heads=int(v.get("num_attention_heads", 16)),
                image=image, patch=patch, layer=layer, params=tower, patches=n, head_linears=head_linears)


def _llava(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """LLaVA 1.5: a CLIP (or SigLIP) tower and a two-layer MLP projector from the selected feature
    layer(s) to the LLM. Every tower layer is built and counted, though features come from
    `vision_feature_layer` (-2 by default); the image tokens are the patches (`default` strategy
    drops CLIP's class token)."""
    vit = _clip_or_siglip(v, "clip_vision_model")
    feature = config.get("vision_feature_layer", -2)
    inputs = vit.hidden * (len(feature) if isinstance(feature, (list, tuple)) else 1)
    bias = bool(config.get("multimodal_projector_bias", True))
    projector = (Linear("linear_1", inputs, text_hidden, bias=bias),
                 Linear("linear_2", text_hidden, text_hidden, bias=bias))
    default_strategy = config.get("vision_feature_select_strategy", "default") == "default"
    llm_tokens = vit.patches - 1 if not vit.siglip and default_strategy else vit.patches
    return VisionSpec(family="llava", block_class=vit.block_class, depth=vit.layers, hidden_size=vit.hidden, intermediate_size=vit.intermediate,
                      num_heads=vit.heads, gated_mlp=False, patch_size=vit.patch, patch_values=3 * vit.patch ** 2,
                      tower_params=vit.params, projector_params=sum(lin.params for lin in projector),
                      layer_linears=vit.layer, projector_linears=projector, projector_hidden=text_hidden,
                      other_linear_params=vit.head_linears, image_size=vit.image, patches_per_tile=vit.patches,
                      llm_tokens_fixed=llm_tokens)


def _gemma3(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """Gemma 3: a SigLIP tower at 896 px (4096 patches, no pooling head), average-pooled to
    `mm_tokens_per_image` (256) tokens, RMS-normalised and projected by one matrix (no bias)."""
    v = {"model_type": "siglip_vision_model", "image_size": 896, "vision_use_head": False, **v}
    vit = _clip_or_siglip(v, "siglip_vision_model")
    h = vit.hidden
    projector = (Linear("mm_input_projection", h, text_hidden),)
    return VisionSpec(family="gemma3", block_class=vit.block_class, depth=vit.layers, hidden_size=h, intermediate_size=vit.intermediate,
                      num_heads=vit.heads, gated_mlp=False, patch_size=vit.patch, patch_values=3 * vit.patch ** 2,
                      tower_params=vit.params, projector_params=h * text_hidden + h, layer_linears=vit.layer,
                      projector_linears=projector, projector_norm=h, other_linear_params=vit.head_linears,
                      image_size=vit.image, patches_per_tile=vit.patches,
                      llm_tokens_fixed=int(config.get("mm_tokens_per_image", 256)))


def _mllama(config: dict[str, Any], v: dict[str, Any], text_hidden: int) -> VisionSpec:
    """Mllama (Llama 3.2 Vision): a ViT over up to `max_num_tiles` tiles of `image_size` px with a
    class token per tile (padded to a multiple of 8 tokens), `num_hidden_layers` local and
    `num_global_layers` gated global layers, tile and aspect-ratio embeddings, and one linear from
    the concatenated intermediate features (`vision_output_dim`) to the LLM. Images reach the LLM
    through cross-attention layers, not as tokens in its sequence."""
    h = int(v.get("hidden_size", 1280))
    i = int(v.get("intermediate_size", 5120))
    local, global_ = int(v.get("num_hidden_layers", 32)), int(v.get("num_global_layers", 8))
    image, patch = _patch(v, "image_size", 560), _patch(v, "patch_size", 14)
    tiles = int(v.get("max_num_tiles", 4))
    ratios = len(v.get("supported_aspect_ratios") or ()) or _MLLAMA_RATIOS
    channels = int(v.get("num_channels", 3))
    n = (image // patch) ** 2 + 1
    layer = _vit_layer(h, i, fused_qkv=False, qkv_bias=False)
    # q/k/v/o carry no bias; fc1/fc2 do; the global layers add two gates each
    per_layer = sum(lin.params for lin in layer) + 2 * _ln(h)
    embeddings = (channels * patch * patch * h + h + (1 + n * h + (ratios + 1) * tiles * n * h)
                  + 2 * (1 + (ratios + 1) * tiles * h))
    tower = embeddings + 2 * _ln(h) + (local + global_) * per_layer + 2 * global_
    out = int(v.get("vision_output_dim", 7680))
    projector = (Linear("multi_modal_projector", out, text_hidden, bias=True),)
    text_config = config.get("text_config")
    text = text_config if isinstance(text_config, dict) else {}
    cross = len(text.get("cross_attention_layers") or (3, 8, 13, 18, 23, 28, 33, 38))
    return VisionSpec(family="mllama", block_class="MllamaVisionEncoderLayer", depth=local + global_, hidden_size=h, intermediate_size=i,
                      num_heads=int(v.get("attention_heads", 16)), gated_mlp=False, patch_size=patch,
                      patch_values=channels * patch * patch, tower_params=tower,
                      projector_params=projector[0].params, layer_linears=layer, projector_linears=projector,
                      image_size=image, tiles=tiles, patches_per_tile=-(-n // 8) * 8, llm_tokens_fixed=1,
                      in_sequence=False, cross_attention_layers=cross,
                      approximate=f"Mllama is approximate: its {cross} cross-attention text layers are counted as "
                                  "self-attention layers (the same projections but for their q/k norms and gates) and "
                                  "its 8 extra embedding rows are left out (under 0.01% of the parameters); their "
                                  "keys and values over the image's tokens are counted as vision activations")


_READERS = {"qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "llava": _llava,
            "gemma3": _gemma3, "mllama": _mllama}
