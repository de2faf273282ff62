"""Model loading: built-in ``tiny:<arch>`` models, plugin models, local directories and hub ids.

Decisions made here (dtype, attention kernel) follow the recipe and the device of the plan; nothing
GPU-only is ever switched on for a CPU run.

The `models` registry (entry-point group ``recipeforge.models``) maps model ids to a `ModelEntry`:
the architecture the planner sizes, and optionally a loader that builds the model. The built-in
table of well-known hub ids (`plan.catalog`) registers there too, without loaders (they load from
the hub). The top of this module stays light (no torch): the planner imports the registry.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
from recipeforge.errors import Location, RecipeError, did_you_mean
from recipeforge.registry import Registry

FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class ModelEntry:
    """A model id a plugin (or the built-in table) adds.

    `config` holds transformers config.json fields (model_type, vocab_size, hidden_size, ...): the
    planner counts parameters and memory from it without weights. `load`, when given, builds the
    model for training: ``load(name, tokenizer, *, device, dtype, attn_implementation, seed,
    revision, trust_remote_code, max_position_embeddings, quantization_config) -> model`` (dtype a
    torch dtype, attention already resolved for the device). Without it the id loads from the hub.
    """

    config: dict
    load: Optional[Callable[..., Any]] = None
    description: str = ""


def _as_model(name: str, obj: object) -> ModelEntry:
    """A registered object as a `ModelEntry`: a plain mapping is an architecture without a loader."""
    if isinstance(obj, ModelEntry):
        entry = obj
    elif isinstance(obj, dict):
        entry = ModelEntry(dict(obj))
    else:
        raise TypeError(f"a model must be a ModelEntry or a config mapping, got {type(obj).__name__}")
    if not isinstance(entry.config.get("model_type"), str):
        raise TypeError(f"model '{name}': its config needs a model_type")
    return entry


models: Registry[ModelEntry] = Registry("models", coerce=_as_model)


def resolve_dtype(name: str, device: str):
    """`model.dtype` as a torch dtype: `auto` is bf16 on GPUs that support it, else fp16 on GPU, fp32 on CPU."""
    import torch

    if name != "auto":
        return getattr(torch, _DTYPES[name])
    if device == "cuda" and torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def resolve_attn_implementation(name: str, device: str, *, location: Location | None = None) -> str:
    """`model.attn_implementation`: `auto` picks flash-attention on a GPU that has it installed, else sdpa."""
    has_flash = importlib.util.find_spec("flash_attn") is not None
    if name == "auto":
        return "flash_attention_2" if device == "cuda" and has_flash else "sdpa"
    if name in FLASH_IMPLEMENTATIONS:
        if device != "cuda":
            raise RecipeError(f"attention '{name}' needs a CUDA GPU, and this run is planned for {device}",
                              key="model.attn_implementation", location=location,
                              hint="use attn_implementation: auto (sdpa on CPU)")
        if not has_flash:
            raise RecipeError(f"attention '{name}' needs the flash-attn package, which is not installed",
                              key="model.attn_implementation", location=location,
                              hint="pip install 'recipeforge[flash]', or use attn_implementation: sdpa")
    if name == "flex_attention" and device != "cuda":
        raise RecipeError("flex_attention has no backward pass on CPU", key="model.attn_implementation",
                          location=location, hint="use attn_implementation: sdpa or eager")
    return name


def tiny_config(arch: str, tokenizer, *, max_position_embeddings: int | None = None,
                location: Location | None = None):
    """The transformers config of a built-in tiny model, with the tokenizer's special token ids."""
    if arch not in TINY_CONFIGS:
        raise RecipeError(f"unknown tiny model 'tiny:{arch}'", key="model.name_or_path", location=location,
                          hint=did_you_mean(arch, TINY_CONFIGS) or
                          f"available: {', '.join('tiny:' + a for a in TINY_CONFIGS)}")
    fields = TINY_CONFIGS[arch]
    if "vision_config" in fields:
        from recipeforge.components.vision_model import tiny_vision_config

        return tiny_vision_config(arch, fields, tokenizer, location=location)
    return config_for(fields, tokenizer, max_position_embeddings=max_position_embeddings)


def config_for(fields: dict, tokenizer, *, max_position_embeddings: int | None = None):
    """A transformers config from config.json `fields`, with the tokenizer's special token ids."""
    from transformers import AutoConfig

    kwargs = dict(fields)
    model_type = kwargs.pop("model_type")
    if max_position_embeddings:
        kwargs["max_position_embeddings"] = max_position_embeddings
    # A token added by the recipe (model.special_tokens) lies past the built vocabulary until the
    # embeddings are resized (`vocab.fit_model`); the config cannot name it before.
    ids = {k: getattr(tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    ids = {k: (v if v is None or v < kwargs.get("vocab_size", v + 1) else None) for k, v in ids.items()}
    # A real config.json names its own special token ids; the tokenizer the run trains with wins.
    kwargs.update(ids)
    return AutoConfig.for_model(model_type, **kwargs)


def build_tiny_model(arch: str, tokenizer, *, seed: int, dtype, attn_implementation: str,
                     max_position_embeddings: int | None = None, location: Location | None = None,
                     num_labels: int | None = None, device: str = "cpu"):
    """A random-init tiny model; the same seed gives the same weights on every run (resume relies on it).
    `num_labels`: a sequence-classification head of that many outputs instead of the LM head."""
    config = tiny_config(arch, tokenizer, max_position_embeddings=max_position_embeddings, location=location)
    return build_random(random_spec(config, tokenizer, seed=seed, dtype=dtype, attn_implementation=attn_implementation,
                                    num_labels=num_labels), tokenizer, name=f"tiny:{arch}", device=device)


def build_random_model(config: dict, tokenizer, *, name: str, seed: int, dtype, attn_implementation: str,
                       max_position_embeddings: int | None = None, num_labels: int | None = None,
                       device: str = "cpu"):
    """A random-init causal LM of the architecture `config` (config.json fields), with the
    tokenizer's special tokens, made on `device`; deterministic in `seed`. For plugin loaders of
    small models. `num_labels`: a sequence-classification head of that many outputs instead of the
    LM head."""
    cfg = config_for(config, tokenizer, max_position_embeddings=max_position_embeddings)
    return build_random(random_spec(cfg, tokenizer, seed=seed, dtype=dtype, attn_implementation=attn_implementation,
                                    num_labels=num_labels), tokenizer, name=name, device=device)


def random_spec(config, tokenizer, *, seed: int, dtype, attn_implementation: str, num_labels: int | None = None,
                new_rows: tuple[int, ...] = ()):
    """The `components.model_init.RandomInit` of a random-init model of `config`: its vocabulary
    grown to the tokenizer (the rows of the tokens a recipe adds, `new_rows`, start at the mean of
    the others)."""
    from recipeforge.components.model_init import RandomInit, grown_vocab

    return RandomInit(grown_vocab(config, len(tokenizer)), dtype=dtype, seed=seed,
                      attn_implementation=attn_implementation, num_labels=num_labels, new_rows=tuple(new_rows))


def build_random(spec, tokenizer, *, name: str, device: str = "cpu", quantization_config: object = None):
    """The random-init model `spec` describes, made module by module where it trains (the GPU of this
    process, or the CPU), 4-bit or 8-bit layers quantized there when `quantization_config` is given
    (`components.model_init`)."""
    from recipeforge.components.model_init import RandomWeights, build_skeleton, forked_rng, materialize

    target = training_device(device)
    model, quantizer = build_skeleton(spec.config, dtype=spec.dtype, attn_implementation=spec.attn_implementation,
                                      num_labels=spec.num_labels, quantization_config=quantization_config)
    with forked_rng(target):  # making weights does not move the caller's random stream
        materialize(model, RandomWeights(model, spec, device=target), device=target)
    if quantizer is not None:
        quantizer.postprocess_model(model)  # config.quantization_config, is_loaded_in_4bit: what peft reads
        model.hf_quantizer = quantizer
    model.config._name_or_path = name
    _sync_generation_config(model, tokenizer)
    return model


def training_device(device: str):
    """The torch device a process of a run trains on: its own GPU (the local rank's, under torchrun
    or `accelerate launch`), or the CPU."""
    import torch

    if device != "cuda":
        return torch.device("cpu")
    return torch.device("cuda", quantized_device_map(device)[""])


def plugin_loader(name_or_path: str):
    """The loader a plugin registered for `name_or_path`, or None (local paths never match)."""
    if Path(name_or_path).expanduser().exists() or not models.has(name_or_path):
        return None
    return models.get(name_or_path, key="model.name_or_path").load


def quantized_device_map(device: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Where a quantized model is loaded: this process's own GPU, or the CPU.

    Each process of a launched job trains on the GPU of its local rank (torchrun and `accelerate
    launch` set ``LOCAL_RANK``); loading every rank onto GPU 0 would put all copies on one device.
    """
    if device != "cuda":
        return {"": "cpu"}
    env = os.environ if environ is None else environ
    try:
        local_rank = int(env.get("LOCAL_RANK", 0))
    except ValueError:
        local_rank = 0
    return {"": max(local_rank, 0)}


def load_model(name_or_path: str, tokenizer, *, vocab=None, **kwargs):
    """`_load_model` (see there for the arguments), then the embeddings fitted to the tokenizer:
    a row for every token, the rows of the tokens the recipe added (`vocab`, a
    `components.vocab.VocabChange`) started at the mean of the others, and generation stopping at
    the turn-end tokens."""
    from recipeforge.components.vocab import fit_model

    model = _load_model(name_or_path, tokenizer, new_rows=tuple(vocab.new_ids) if vocab else (), **kwargs)
    fit_model(model, tokenizer, vocab)
    return model


def _load_model(name_or_path: str, tokenizer, *, device: str, dtype: str = "auto", attn_implementation: str = "auto",
               revision: str | None = None, trust_remote_code: bool = False, seed: int = 42,
               max_position_embeddings: int | None = None, quantization_config: object = None,
               random_config: dict | None = None, location: Location | None = None,
               num_labels: int | None = None, new_rows: tuple[int, ...] = ()):
    """Load (or, for ``tiny:*``, build) the causal LM a recipe names, ready to train on `device`.

    `num_labels` loads the same model with a sequence-classification head of that many outputs
    (`AutoModelForSequenceClassification`; a reward model has one) in place of the LM head; its pad
    token id is the tokenizer's, which the head needs to find the last token of each sequence.

    `random_config` (config.json fields, for `model.init: random`) builds that architecture with
    random weights instead of loading any; random-init models are made where they train, module by
    module (`components.model_init`), quantized there for QLoRA. `new_rows`: ids of the tokens the
    recipe added, whose rows of a random-init model start at the mean of the others.
    """
    torch_dtype = resolve_dtype(dtype, device)
    attn = resolve_attn_implementation(attn_implementation, device, location=location)
    spec = random_init_spec(name_or_path, tokenizer, dtype=torch_dtype, attn_implementation=attn, seed=seed,
                            max_position_embeddings=max_position_embeddings, num_labels=num_labels,
                            random_config=random_config, new_rows=new_rows, location=location)
    if spec is not None:
        return build_random(spec, tokenizer, name=name_or_path, device=device, quantization_config=quantization_config)
    loader = plugin_loader(name_or_path)
    if loader is not None:
        return _load_from_plugin(loader, name_or_path, tokenizer, num_labels=num_labels, location=location,
                                 device=device, dtype=torch_dtype, attn_implementation=attn, seed=seed,
                                 revision=revision, trust_remote_code=trust_remote_code,
                                 max_position_embeddings=max_position_embeddings,
                                 quantization_config=quantization_config)
    return _load_pretrained(name_or_path, tokenizer, device=device, dtype=torch_dtype, attn_implementation=attn,
                            revision=revision, trust_remote_code=trust_remote_code,
                            max_position_embeddings=max_position_embeddings,
                            quantization_config=quantization_config, num_labels=num_labels, location=location)


def random_init_spec(name_or_path: str, tokenizer, *, dtype, attn_implementation: str, seed: int,
                     max_position_embeddings: int | None = None, num_labels: int | None = None,
                     random_config: dict | None = None, new_rows: tuple[int, ...] = (),
                     location: Location | None = None):
    """The `RandomInit` of a random-init model (`random_config`, or a built-in ``tiny:*`` name), or
    None for a model loaded from weights. `dtype` is a torch dtype, the attention resolved."""
    if random_config is not None:
        _check_random_vocab(name_or_path, tokenizer, random_config, new_rows, location=location)
        config = config_for(random_config, tokenizer, max_position_embeddings=max_position_embeddings)
    else:
        arch = tiny_arch(name_or_path)
        if arch is None:
            return None
        config = tiny_config(arch, tokenizer, max_position_embeddings=max_position_embeddings, location=location)
    return random_spec(config, tokenizer, seed=seed, dtype=dtype, attn_implementation=attn_implementation,
                       num_labels=num_labels, new_rows=new_rows)


def _check_random_vocab(name_or_path: str, tokenizer, random_config: dict, new_rows: tuple[int, ...] = (), *,
                        location: Location | None) -> None:
    """Refuse a tokenizer with more tokens than the random-init config has embedding rows (the
    tokens the recipe adds, `new_rows`, get rows of their own)."""
    vocab = random_config.get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) - len(new_rows) > vocab:
        raise RecipeError(f"the tokenizer has {len(tokenizer)} tokens, more than the {vocab} rows of the "
                          f"embedding in the config of '{name_or_path}'", key="model.tokenizer", location=location,
                          hint="use the model's own tokenizer, or a config with a larger vocab_size")


def _load_from_plugin(loader: Callable[..., Any], name_or_path: str, tokenizer, *, num_labels: int | None,
                      location: Location | None, **kwargs):
    """The model a plugin's loader builds (`kwargs`: the loader's keyword arguments, see `ModelEntry`)."""
    if num_labels is not None:
        raise RecipeError(f"model '{name_or_path}' comes from a plugin loader, which builds causal LMs; this stage "
                          f"needs a sequence-classification head", key="model.name_or_path", location=location,
                          hint="use a local directory or hub id (loaded with AutoModelForSequenceClassification)")
    model = loader(name_or_path, tokenizer, **kwargs)
    _sync_generation_config(model, tokenizer)
    return model


def _load_pretrained(name_or_path: str, tokenizer, *, device: str, dtype, attn_implementation: str,
                     revision: str | None, trust_remote_code: bool, max_position_embeddings: int | None,
                     quantization_config: object, num_labels: int | None, location: Location | None):
    """A local directory or hub id through transformers' auto classes, its embeddings grown to the tokenizer."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if num_labels is None else AutoModelForSequenceClassification
    if num_labels is None and _is_vision_checkpoint(name_or_path, revision, trust_remote_code):
        auto = AutoModelForImageTextToText  # a vision-language model: its tower, projector and processor
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn_implementation, "revision": revision,
                              "trust_remote_code": trust_remote_code}
    if num_labels is not None:
        kwargs["num_labels"] = num_labels
    if max_position_embeddings:
        kwargs["max_position_embeddings"] = max_position_embeddings
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
        # 4-bit weights cannot move between devices after loading; place them where they train.
        kwargs["device_map"] = quantized_device_map(device)
    model = _from_pretrained(auto, name_or_path, kwargs, location=location)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    _sync_generation_config(model, tokenizer)
    return model


def _is_vision_checkpoint(name_or_path: str, revision: str | None, trust_remote_code: bool) -> bool:
    """Whether the checkpoint's config has a vision part (False when it cannot be read: the load says why)."""
    from transformers import AutoConfig

    from recipeforge.components.vision_model import is_vision_model

    try:
        return is_vision_model(AutoConfig.from_pretrained(name_or_path, revision=revision,
                                                          trust_remote_code=trust_remote_code))
    except (OSError, ValueError, KeyError):
        return False


def _from_pretrained(auto, name_or_path: str, kwargs: dict[str, Any], *, location: Location | None):
    """`auto.from_pretrained`, with what went wrong (a missing or unreadable model, code it may not run)
    said as a `RecipeError` at `model.name_or_path`."""
    try:
        return auto.from_pretrained(name_or_path, **kwargs)
    except OSError as exc:
        where = "local directory" if Path(name_or_path).expanduser().exists() else "model"
        raise RecipeError(f"cannot load {where} '{name_or_path}': {_first_line(exc)}", key="model.name_or_path",
                          location=location,
                          hint="give a directory with config.json and weights, a hub id reachable from this "
                               "machine, or tiny:llama for an offline model") from None
    except ValueError as exc:
        raise RecipeError(f"cannot load model '{name_or_path}': {_first_line(exc)}", key="model.name_or_path",
                          location=location, hint=_load_error_hint(exc)) from None


def _load_error_hint(exc: ValueError) -> str | None:
    """What to do about a ValueError of `from_pretrained`: code the model ships, or an unknown architecture."""
    if "trust_remote_code" in str(exc):
        return "set model.trust_remote_code: true if you trust this model's code"
    if "does not recognize this architecture" in str(exc):
        return ("this transformers version has no such model type: upgrade transformers, or set "
                "model.trust_remote_code: true for a model that ships its own code")
    return None


def _sync_generation_config(model, tokenizer) -> None:
    """Make the model agree with the tokenizer on special tokens, so generation stops and pads right."""
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tokenizer.pad_token_id
        if tokenizer.eos_token_id is not None:
            gen.eos_token_id = tokenizer.eos_token_id
        if tokenizer.bos_token_id is not None:
            gen.bos_token_id = tokenizer.bos_token_id


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = trainable = 0
    for p in model.parameters():
        n = p.numel()
        total += n
        if p.requires_grad:
            trainable += n
    return trainable, total


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
