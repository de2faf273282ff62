"""Vision-language models (VLMs): recognising them, their processor, where their vision tower and
projector are, what trains, and the check that the text holds as many image tokens as the model
makes image features.

A model is a VLM when its config has a ``vision_config``; it loads with transformers'
`AutoModelForImageTextToText` and its processor (image processor + tokenizer + chat template) with
`AutoProcessor`. The built-in ``tiny:llava`` is built here, offline: the tiny tokenizer with an image
token, a CLIP image processor (the PIL one: no torchvision needed) and a chat template that marks the
assistant replies with ``{% generation %}`` (the loss mask).

`VISION_PARTS` names, per architecture, the modules of the vision tower and of the projector (named
once; every other module is the language model). Full fine-tuning freezes them unless
`model.vision.train_tower` / `train_projector`; LoRA targets the language model's linears, and the
projector's or the tower's only when they train.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Protocol, Union

from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


# What this module reads of a recipe (the `model.vision`, `adapter`, `model` and `data` sections; the
# config layer above defines them, so they are described here by the fields read).
class VisionSettings(Protocol):
    """`model.vision`: which parts train, and how images are sized."""

    @property
    def train_tower(self) -> bool: ...
    @property
    def train_projector(self) -> bool: ...
    @property
    def min_pixels(self) -> int | None: ...
    @property
    def max_pixels(self) -> int | None: ...


class AdapterTargets(Protocol):
    """`adapter`: the linear layers LoRA targets and the modules trained whole."""

    @property
    def target_modules(self) -> Union[str, tuple[str, ...]]: ...
    @property
    def modules_to_save(self) -> tuple[str, ...]: ...


class ProcessorModel(Protocol):
    """`model`: where the processor is loaded from."""

    @property
    def name_or_path(self) -> str: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def trust_remote_code(self) -> bool: ...
    @property
    def vision(self) -> VisionSettings: ...


class ProcessorData(Protocol):
    """`data`: the chat template asked for."""

    @property
    def chat_template(self) -> str: ...


class ProcessorRecipe(Protocol):
    """The recipe, as far as its processor goes."""

    @property
    def model(self) -> ProcessorModel: ...
    @property
    def data(self) -> ProcessorData: ...


# model_type -> (vision tower modules, projector modules): dotted module names as they appear inside
# parameter names (any prefix). A projector inside the tower (Qwen-VL's `visual.merger`) is the projector.
VISION_PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qwen2_vl": (("visual",), ("visual.merger",)),
    "qwen2_5_vl": (("visual",), ("visual.merger",)),
    "qwen3_vl": (("visual",), ("visual.merger", "visual.deepstack_merger_list")),
    "llava": (("vision_tower",), ("multi_modal_projector",)),
    "llava_next": (("vision_tower",), ("multi_modal_projector",)),
    "llava_onevision": (("vision_tower",), ("multi_modal_projector",)),
    "mllama": (("vision_model",), ("multi_modal_projector",)),
    "gemma3": (("vision_tower",), ("multi_modal_projector",)),
    "idefics3": (("vision_model",), ("connector",)),
    "smolvlm": (("vision_model",), ("connector",)),
}

# --- recognising a VLM (no torch) ---------------------------------------------------------------
def is_vision_config(fields: dict | None) -> bool:
    """Whether config.json `fields` describe a vision-language model."""
    return isinstance(fields, dict) and isinstance(fields.get("vision_config"), dict)


def is_vision_model(config: object) -> bool:
    """Whether a transformers config (or a model's) belongs to a vision-language model."""
    config = getattr(config, "config", config)
    return getattr(config, "vision_config", None) is not None


# --- the tower and the projector ------------------------------------------------------------
def vision_parts(model_type: str, *, location: Location | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tower modules, projector modules) of a VLM architecture."""
    if model_type not in VISION_PARTS:
        raise RecipeError(f"recipeforge does not know where the vision tower and projector of model type "
                          f"'{model_type}' are", key="model.name_or_path", location=location,
                          hint=f"known vision-language architectures: {', '.join(VISION_PARTS)}")
    return VISION_PARTS[model_type]


def _inside(name: str, module: str) -> bool:
    return f".{module}." in f".{name}."


def part_of(name: str, parts: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    """``projector``, ``tower`` or ``language`` for a parameter or module name."""
    tower, projector = parts
    if any(_inside(name, p) for p in projector):
        return "projector"
    if any(_inside(name, t) for t in tower):
        return "tower"
    return "language"


def _model_type(model: torch.nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", "") or ""


def freeze_vision(model: torch.nn.Module, vision: VisionSettings, *, log=None, location: Location | None = None) -> dict[str, int]:
    """Full fine-tuning: freeze the tower unless `vision.train_tower`, the projector unless
    `vision.train_projector`. Returns the parameters of each part that train."""
    parts = vision_parts(_model_type(model), location=location)
    keep = {"tower": vision.train_tower, "projector": vision.train_projector}
    counts = {"tower": 0, "projector": 0, "language": 0}
    for name, param in model.named_parameters():
        part = part_of(name, parts)
        if part in keep and not keep[part]:
            param.requires_grad_(False)
        if param.requires_grad:
            counts[part] += param.numel()
    if log is not None:
        log(f"vision: tower {'trains' if vision.train_tower else 'frozen'}, projector "
            f"{'trains' if vision.train_projector else 'frozen'} ({counts['language']:,} language-model, "
            f"{counts['projector']:,} projector, {counts['tower']:,} tower parameters train)")
    return counts


def lora_targets(model: torch.nn.Module, adapter: AdapterTargets, vision: VisionSettings, *, location: Location | None = None) -> list[str]:
    """The modules of a VLM that get LoRA adapters: the linear layers `adapter.target_modules` names
    (``all-linear``: all) in the language model, and in the projector / tower only when they train.
    The output layer and `adapter.modules_to_save` are never adapted. Full module names (peft matches
    them exactly), so adapter_config.json says what was adapted."""
    import torch

    parts = vision_parts(_model_type(model), location=location)
    allowed = {"language", *(["projector"] if vision.train_projector else []), *(["tower"] if vision.train_tower else [])}
    wanted = adapter.target_modules
    names_wanted = None if isinstance(wanted, str) and wanted == "all-linear" else \
        ({wanted} if isinstance(wanted, str) else set(wanted))
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = set(adapter.modules_to_save)
    targets = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in skip or name in skip or part_of(name, parts) not in allowed:
            continue
        if names_wanted is not None and leaf not in names_wanted and name not in names_wanted:
            continue
        targets.append(name)
    if not targets:
        raise RecipeError(f"adapter.target_modules {wanted!r} selects no linear layer of the language model",
                          key="adapter.target_modules", hint="use all-linear, or names like q_proj, v_proj")
    return targets


# --- tokenizer, processor, tiny model ---------------------------------------------------------
def tiny_vision(arch: str | None) -> dict | None:
    """The image settings of a tiny VLM (`tiny_spec.TINY_VISION`), None for other models."""
    from recipeforge.components.tiny_spec import TINY_VISION

    return TINY_VISION.get(arch) if arch else None


def tiny_vision_config(arch: str, fields: dict, tokenizer, *, location: Location | None = None):
    """The transformers config of a tiny VLM: its text side takes the tokenizer's special token ids,
    the model its image token id (the tokenizer must have it: the tiny tokenizer of `arch` does)."""
    from transformers import AutoConfig

    image_token = tiny_vision(arch)["image_token"]
    if image_token not in tokenizer.get_vocab():
        raise RecipeError(f"the tokenizer has no image token {image_token}, which tiny:{arch} needs",
                          key="model.tokenizer", location=location,
                          hint=f"leave model.tokenizer unset: tiny:{arch} builds its own")

    kwargs = {k: v for k, v in fields.items() if k != "model_type"}
    text = dict(kwargs.pop("text_config"))
    text.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id)
    return AutoConfig.for_model(fields["model_type"], text_config=text, **kwargs,
                                image_token_id=tokenizer.convert_tokens_to_ids(image_token),
                                pad_token_id=tokenizer.pad_token_id)


def load_processor(recipe: ProcessorRecipe, tokenizer, *, location: Location | None = None):
    """The processor of the recipe's VLM around `tokenizer` (the run's, with its chat template and
    added tokens), images sized by `model.vision.min_pixels` / `max_pixels` when set."""
    from recipeforge.components.tiny_spec import tiny_arch

    m = recipe.model
    spec = tiny_vision(tiny_arch(m.name_or_path))
    if spec is not None:
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        size = spec["image_size"]
        images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
        processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, chat_template=tokenizer.chat_template,
                                   patch_size=spec["patch_size"], vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, image_token=spec["image_token"])
    else:
        from transformers import AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(m.tokenizer or m.name_or_path, revision=m.revision,
                                                      trust_remote_code=m.trust_remote_code)
        except (OSError, ValueError, ImportError) as exc:
            raise RecipeError(f"cannot load the processor of '{m.name_or_path}': {_first_line(exc)}",
                              key="model.name_or_path", location=location,
                              hint="a vision-language model needs its processor files (preprocessor_config.json) "
                                   "next to the tokenizer") from None
        processor.tokenizer = tokenizer
        if recipe.data.chat_template != "tokenizer" or not getattr(processor, "chat_template", None):
            processor.chat_template = tokenizer.chat_template
    set_pixels(processor, recipe.model.vision)
    return processor


def set_pixels(processor, vision: VisionSettings) -> None:
    """`vision.min_pixels` / `max_pixels` on the image processor: Qwen-VL style processors bound the
    area; others resize the shortest edge to the square root of `min_pixels`."""
    images = getattr(processor, "image_processor", None)
    if images is None or (vision.min_pixels is None and vision.max_pixels is None):
        return
    if hasattr(images, "min_pixels") or hasattr(images, "max_pixels"):
        size = dict(getattr(images, "size", None) or {})
        if vision.min_pixels is not None:
            images.min_pixels = size["shortest_edge"] = vision.min_pixels
        if vision.max_pixels is not None:
            images.max_pixels = size["longest_edge"] = vision.max_pixels
        images.size = size
    elif vision.min_pixels is not None and isinstance(getattr(images, "size", None), dict):
        images.size = {**images.size, "shortest_edge": int(vision.min_pixels ** 0.5)}


def check_template(processor, *, location: Location | None = None) -> None:
    """The loss is limited to the assistant replies through the template's ``{% generation %}`` marks."""
    from recipeforge.components.chat_templates import GENERATION_TAG

    template = getattr(processor, "chat_template", None) or ""
    if not GENERATION_TAG.search(template if isinstance(template, str) else ""):
        raise RecipeError("the processor's chat template has no {% generation %} marks, so the loss cannot be "
                          "limited to the assistant replies", key="data.chat_template", location=location,
                          hint="give data.chat_template a .jinja copy of the model's template with each assistant "
                               "reply inside {% generation %}...{% endgeneration %} (examples/yaml/vlm/ has one "
                               "for Qwen2-VL / Qwen2.5-VL)")


# --- images against image tokens --------------------------------------------------------------
def expected_image_tokens(config: PretrainedConfig, batch: dict, images: int) -> int | None:
    """How many image tokens the model expects for a processed batch of `images` images, from its
    config and the processor's output; None for an architecture this does not know."""
    model_type = getattr(config, "model_type", "")
    if "image_grid_thw" in batch:  # Qwen-VL: one token per merge x merge patches
        merge = getattr(config.vision_config, "spatial_merge_size", 2)
        return int(batch["image_grid_thw"].prod(-1).sum()) // (merge * merge)
    if model_type == "llava":
        v = config.vision_config
        per = (v.image_size // v.patch_size) ** 2 + (1 if config.vision_feature_select_strategy == "full" else 0)
        return per * images
    if model_type == "gemma3":
        return int(config.mm_tokens_per_image) * images
    return None


def check_image_tokens(collate, rows: Iterable[tuple[str, dict]], config: PretrainedConfig, image_token_id: int,
                       max_length: int | None) -> None:
    """Encode each of `rows` ((where, row)) with `collate` (the trainer's collator, not truncating) and refuse one whose image
    tokens differ from what the model makes of its images, or whose sequence would be cut (a cut
    through the image tokens breaks the model). `where` names the row in messages."""
    for where, row in rows:
        batch = collate([dict(row)])
        ids = batch["input_ids"][0]
        found = int((ids == image_token_id).sum())
        expected = expected_image_tokens(config, batch, len(row.get("images") or ()))
        if expected is not None and found != expected:
            raise RecipeError(f"{where}: the processor wrote {found} image tokens for its "
                              f"{len(row.get('images') or ())} image(s), the model expects {expected}",
                              key="data.datasets",
                              hint="each image entry of the row needs one image in its images list; the "
                                   "processor and the model must come from the same checkpoint")
        if max_length is not None and int(batch["attention_mask"][0].sum()) > max_length:
            raise RecipeError(f"{where}: {int(batch['attention_mask'][0].sum())} tokens with its image tokens, "
                              f"data.sequence_len is {max_length}; cutting it would cut through the image",
                              key="data.sequence_len",
                              hint="raise data.sequence_len, or lower model.vision.max_pixels")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
