"""Axolotl's multimodal (vision-language) keys as `model.vision` keys, or reported.

Axolotl trains a vision-language model (VLM) when the config loads a processor (`processor_type:
AutoProcessor`) and feeds image rows through a vision chat template; its docs pair that with
`skip_prepare_dataset: true`, `remove_unused_columns: false` and `sample_packing: false`, and keep
LoRA on the language model with a regular expression such as
``model.language_model.layers.[\\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj``.

recipeforge says which parts of a VLM train with `model.vision.train_tower` (the vision encoder) and
`model.vision.train_projector` (the projector into the language model), and bounds the image area
with `model.vision.min_pixels` / `max_pixels`. What the Axolotl config selected by module or
parameter name is read back into those two switches; the image size becomes the area bounds.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from recipeforge.config.axolotl.values import num

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

# Axolotl chat template names that exist only for vision-language models.
VISION_TEMPLATES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llama3_2_vision", "llava", "pixtral")
# Hub ids (lower-cased) of models that are vision-language models whatever they are fine-tuned on.
# Gemma 3 (4B and up), Llama 4 and Mistral Small 3.1 also read images but are often trained on text
# alone, so their names are not enough: the config's multimodal keys decide for them.
VLM_NAME = re.compile(r"[-_/]vl\b|[-_]vl[-_]|vision|llava|pixtral|idefics|smolvlm|paligemma|internvl|"
                      r"molmo|minicpm-v|\bfuyu")
# Names of the vision encoder and the projector in transformers' VLMs (Qwen2-VL: visual / visual.merger;
# Llama 3.2 Vision: vision_model / multi_modal_projector; Gemma 3, LLaVA, Mistral 3: vision_tower /
# multi_modal_projector).
TOWER = re.compile(r"vision_tower|vision_model|vision_encoder|image_encoder|visual(?![\W_]*merger)")
PROJECTOR = re.compile(r"multi_modal_projector|mm_projector|projector|merger|connector")
LANGUAGE = re.compile(r"language_model|text_model")
IMAGE_COLUMNS = ("images", "image")


def detect(config: dict[str, Any]) -> str | None:
    """Why `config` trains a vision-language model (the first sign found), or None for a text model."""
    for key in ("processor_type", "image_size", "image_resize_algorithm", "freeze_mm_modules"):
        if config.get(key) is not None:
            return f"{key} is set"
    template = config.get("chat_template")
    if template in VISION_TEMPLATES:
        return f"chat_template {template} is a vision template"
    name = str(config.get("base_model") or "")
    if VLM_NAME.search(name.lower()):
        return f"{name} is a vision-language model"
    for key in ("lora_target_modules", "unfrozen_parameters"):
        value = config.get(key)
        text = " ".join(map(str, value)) if isinstance(value, list) else str(value or "")
        if TOWER.search(text) or LANGUAGE.search(text) or re.search(r"multi_modal_projector|mm_projector", text):
            return f"{key} names parts of a vision-language model"
    return None


def parts(pattern: str) -> set[str]:
    """Which parts of a VLM a module or parameter name pattern names: `tower`, `projector`, `language`
    (the language model, by its name), or nothing (a pattern without a path: any part)."""
    found = set()
    if TOWER.search(pattern):
        found.add("tower")
    if PROJECTOR.search(pattern):
        found.add("projector")
    if LANGUAGE.search(pattern):
        found.add("language")
    return found


# -- a PEFT target-module regular expression as module names ---------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WILDCARDS = (".*", ".+", "[\\d]+", "\\d+", "[0-9]+", "[\\d]*", "\\d*", "[0-9]*")
# Path parts that select no more than "the decoder layers of the language model".
# The vision tower's and projector's names are judged apart (model.vision.train_tower / train_projector).
_PLAIN_PATH = re.compile(r"model|language_model|text_model|base_model|layers?|decoder|encoder|transformer|h|blocks|"
                         r"mlp|self_attn|cross_attn|attn|attention|feed_forward|block_sparse_moe|experts|"
                         r"vision_tower|vision_model|visual|multi_modal_projector|merger")


def _components(pattern: str) -> list[str]:
    """`pattern` split at the dots that separate module path parts (a `.` or `\\.` outside brackets and
    groups, not a `.*`/`.+` wildcard)."""
    out, depth, current, i = [], 0, "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            if pattern[i + 1] == "." and depth == 0:
                out.append(current)
                current, i = "", i + 2
                continue
            current += pattern[i:i + 2]
            i += 2
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "." and depth == 0 and pattern[i + 1:i + 2] not in ("*", "+", "?", "{"):
            out.append(current)
            current = ""
        else:
            current += c
        i += 1
    out.append(current)
    return out


def _expand(text: str, limit: int = 64) -> list[str] | None:
    """Every string the regular expression `text` matches when it is built of literal name characters
    and groups of alternatives only, e.g. ``(up|down|gate)_proj``; None otherwise."""
    def seq(i: int) -> tuple[list[str], int]:
        options = [""]
        while i < len(text) and text[i] not in "|)":
            c = text[i]
            if c == "(":
                i += 3 if text.startswith("(?:", i) else 1
                alts: list[str] = []
                while True:
                    got, i = seq(i)
                    alts += got
                    if i >= len(text):
                        raise ValueError("unclosed group")
                    if text[i] == ")":
                        i += 1
                        break
                    i += 1  # past '|'
                options = [o + a for o in options for a in alts]
            elif c == "\\" and i + 1 < len(text) and text[i + 1] in "_-":
                options = [o + text[i + 1] for o in options]
                i += 2
            elif c.isalnum() or c == "_":
                options = [o + c for o in options]
                i += 1
            else:
                raise ValueError(f"{c!r} is not a literal")
            if len(options) > limit:
                raise ValueError("too many names")
        return options, i

    try:
        names, end = seq(0)
    except ValueError:
        return None
    if end != len(text) or not names or not all(_NAME.fullmatch(n) for n in names):
        return None
    return list(dict.fromkeys(names))


def target_names(pattern: str) -> tuple[list[str], str] | None:
    """The module names a PEFT target-module regular expression ends in, and its path part (what the
    names are cut from); None when the last part is not literal names and groups of them."""
    body = pattern.strip()
    body = body[1:] if body.startswith("^") else body
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    comps = _components(body)
    leaf = comps[-1]
    for wild in (".*", ".+"):  # `.*(q|v)_proj`: the names after a leading wildcard
        if leaf.startswith(wild) and leaf[len(wild):].startswith("("):
            leaf = leaf[len(wild):]
    names = _expand(leaf)
    if names is None:
        return None
    return names, ".".join(comps[:-1])


def path_restricts(path: str) -> bool:
    """Whether a pattern's path part selects fewer modules than "every decoder layer" (e.g. some
    layer numbers only); the vision/language prefixes are judged apart."""
    for comp in _components(path):
        if comp in _WILDCARDS or comp == "":
            continue
        names = _expand(comp)
        if names is None or not all(_PLAIN_PATH.fullmatch(n) for n in names):
            return True
    return False


# -- the pass over the config ----------------------------------------------------------------------

def settings(conv: Conversion) -> None:
    """`model.vision`, and the multimodal keys with no counterpart (reported). Runs after the adapter,
    data and optimisation passes: it reads what they wrote."""
    _loading_keys(conv)
    if conv.vision is None:
        return
    _trained_parts(conv)
    _image_size(conv)
    _packing(conv)
    if conv.get("ddp_find_unused_parameters") is not None:
        conv.note("ddp_find_unused_parameters", "not needed: recipeforge's DDP backend searches for parameters "
                                                "without a gradient itself for models with a vision tower")


def _loading_keys(conv: Conversion) -> None:
    """Keys Axolotl needs to load and feed a VLM that recipeforge does on its own."""
    proc = conv.get("processor_type")
    if proc is not None:
        other = "" if str(proc) == "AutoProcessor" else f" ('{proc}' is not used)"
        conv.note("processor_type", f"not needed: recipeforge loads a vision-language model's processor with "
                                    f"AutoProcessor from model.name_or_path{other}")
    if conv.get("processor_config") is not None:
        conv.note("processor_config", "no counterpart: the processor is loaded from model.name_or_path")
    if conv.get("skip_prepare_dataset") is not None:
        conv.note("skip_prepare_dataset", "not needed: recipeforge prepares image rows for the model's "
                                          "processor itself" if conv.vision else
                  "no counterpart; recipeforge always prepares (and caches) the data")
    if conv.get("remove_unused_columns") is not None:
        conv.note("remove_unused_columns", "not needed: recipeforge picks the columns its data path reads (the "
                                           "image column among them) itself")


def _image_size(conv: Conversion) -> None:
    """`image_size` (a side, or [height, width]) as the area bounds; `image_resize_algorithm` reported."""
    size = conv.get("image_size")
    if size is not None:
        if isinstance(size, (list, tuple)) and len(size) == 2:
            h, w = (num(v, int, "image_size") for v in size)
        elif isinstance(size, (list, tuple)):
            h = w = None
            conv.note("image_size", f"{size}: expected a side or [height, width]; not converted (the processor's "
                                    f"own image size)")
        else:
            h = w = num(size, int, "image_size")
        if h is not None and w is not None:
            if h <= 0 or w <= 0:
                conv.note("image_size", f"{size}: not a size; not converted (the processor's own image size)")
            else:
                area = h * w
                conv.put("model.vision.min_pixels", area, "image_size")
                conv.put("model.vision.max_pixels", area, "image_size")
                conv.note("image_size", f"Axolotl resizes every image to exactly {h}x{w}; recipeforge bounds the "
                                        f"image area instead: model.vision.min_pixels = max_pixels = {h}x{w} = "
                                        f"{area}, so each image is resized to about {area} pixels with its "
                                        f"aspect ratio kept (the processor rounds to its patch grid; "
                                        f"processors with a fixed input size or tiling keep theirs)")
    algo = conv.get("image_resize_algorithm")
    if algo is not None:
        conv.note("image_resize_algorithm", f"'{algo}' has no counterpart: images are resampled with the "
                                            f"processor's own filter")


def _trained_parts(conv: Conversion) -> None:
    """`model.vision.train_tower` / `train_projector` from what the config trains by name."""
    adapter = conv.recipe.get("adapter", {}).get("type") in ("lora", "qlora")
    tower = projector = False
    sources: list[str] = []
    freeze = conv.get("freeze_mm_modules")
    if adapter:
        tower, projector, sources = _adapter_parts(conv)
    else:
        patterns = conv.get("unfrozen_parameters")
        patterns = [patterns] if isinstance(patterns, str) else patterns
        if isinstance(patterns, list) and patterns:
            named = [parts(str(p)) for p in patterns]
            tower = any("tower" in p for p in named)
            projector = any("projector" in p for p in named)
            sources = ["unfrozen_parameters"]
            conv.note("unfrozen_parameters", f"the vision tower {'trains' if tower else 'stays frozen'} "
                                             f"(model.vision.train_tower: {str(tower).lower()}) and the projector "
                                             f"{'trains' if projector else 'stays frozen'} (train_projector: "
                                             f"{str(projector).lower()}), as the patterns select; the patterns "
                                             f"stay in train.unfrozen_parameters")
        elif freeze is not True:
            tower = projector = True
            sources = ["base_model"]
            conv.note("base_model", "a full fine-tune of a vision-language model in Axolotl trains every weight, "
                                  "the vision tower's and the projector's too, so the recipe sets "
                                  "model.vision.train_tower and train_projector true (recipeforge's default, "
                                  "false, keeps them frozen)")
    if freeze is not None:
        if freeze is True:
            if tower or projector:
                conv.note("freeze_mm_modules", "true: the vision tower and projector stay frozen, whatever the "
                                               "module patterns select (model.vision.train_tower and "
                                               "train_projector false)")
            tower = projector = False
        sources.append("freeze_mm_modules")
    conv.put("model.vision.train_tower", tower)
    conv.put("model.vision.train_projector", projector)
    for src in dict.fromkeys(sources):
        conv.map(src, "model.vision.train_tower, model.vision.train_projector")


def _adapter_parts(conv: Conversion) -> tuple[bool, bool, list[str]]:
    """Under LoRA: whether Axolotl's target modules put adapters on the tower or the projector."""
    if conv.get("lora_target_linear"):
        conv.note("lora_target_linear", "on a vision-language model Axolotl collects the name of every linear "
                                        "layer, the vision tower's and projector's too, so the recipe sets "
                                        "model.vision.train_tower and train_projector true (adapters there as "
                                        "well); set them false to keep LoRA on the language model, as Axolotl's "
                                        "multimodal docs advise")
        return True, True, ["lora_target_linear"]
    modules = conv.get("lora_target_modules")
    if not modules:
        return False, False, []
    text = " ".join(map(str, modules)) if isinstance(modules, list) else str(modules)
    named = parts(text)
    tower, projector = "tower" in named, "projector" in named
    if not named:
        conv.note("lora_target_modules", "names without a path: in Axolotl they also matched the vision tower's "
                                         "modules of the same names, if it has any; the recipe puts adapters on "
                                         "the language model only (model.vision.train_tower: false), set it true "
                                         "to adapt the tower too")
    return tower, projector, ["lora_target_modules"]


def _packing(conv: Conversion) -> None:
    data = conv.recipe.get("data", {})
    if conv.get("sample_packing") is True:
        data["packing"] = False
        conv.note("sample_packing", "packing is refused for image data (each sample's image tokens must stay "
                                    "with its text), so data.packing is false")


def chat_template_note(name: str) -> str:
    """The report line for a chat template name in a vision-language config."""
    return (f"'{name}': for a vision-language model the processor's own chat template renders the image parts "
            f"(recipeforge's named templates are text-only), so data.chat_template is `tokenizer`, the model's "
            f"own template")


def dataset_notes(conv: Conversion, entry: dict, spec: dict, where: str) -> None:
    """Report the entry keys that name image columns (a recipe dataset has no such key), and, for a chat
    dataset of a VLM config, what recipeforge reads of image rows."""
    for key, value in entry.items():
        if "image" not in key.lower():
            continue
        if str(value) in IMAGE_COLUMNS:
            conv.note(f"{where}.{key}", f"'{value}': recipeforge reads the image column by that name already")
        elif re.search(r"dir|root|folder|base|prefix", key.lower()):
            conv.note(f"{where}.{key}", f"'{value}': a folder for the rows' image paths has no counterpart in a "
                                        f"recipe dataset; write the paths in the rows with it in front")
        else:
            conv.note(f"{where}.{key}", f"'{value}' names where the images are: no counterpart in a recipe "
                                        f"dataset; rename the image column to `images` (a list of image paths "
                                        f"per row) or `image`, or put {{type: image, image: <path>}} parts in "
                                        f"the messages")
    section = where.split("[")[0]
    if conv.vision is not None and spec.get("format") == "messages" and "image rows" not in conv.notes.get(section, ""):
        conv.note(section, "image rows: recipeforge reads {type: image, image: <path>} parts in the messages' "
                         "content lists, or an `images` / `image` column whose images fill the {type: image} "
                         "or <image> placeholders in order; parts that give the image as `path`, `url` or "
                         "`base64` (as Axolotl accepts) need the key `image` with a path")
