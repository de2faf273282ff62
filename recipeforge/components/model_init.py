"""Random initialization where the model trains, one module at a time, deterministic in the seed.

A random-init model (`model.init: random`, the built-in ``tiny:*`` models, plugin models built with
`components.models.build_random_model`) is made in two steps, so that no process ever builds the
whole model in host memory first:

1. `build_skeleton`: the architecture with every parameter on the meta device (no memory) and its
   buffers computed as usual (rotary frequencies); with a quantization config, transformers' own
   quantizer puts bitsandbytes' 4-bit/8-bit linears in place, as for a quantized load. Every module
   is marked with its name in the bare model (`mark_modules`), which survives peft's wrapping and
   FSDP2's class swap.
2. `RandomWeights` makes the weights of one module at a time, whole, on the training device: the
   module's parameters are allocated there and initialized by the model's own `_init_weights` (that of
   the `PreTrainedModel` owning the module, as transformers' `initialize_weights` dispatches it), under
   a seed derived from the run's seed and the module's name. They are then kept whole (`materialize`:
   one process, DDP, ZeRO-1/2), cut to this process's shard (FSDP2) or handed to ZeRO-3's
   partitioning (`backends.sharded_loading`).

Seeding each module by its name makes the weights a function of the seed, the architecture and the
device type alone: the same on one process and on any number of shards, whatever the order in which
modules are reached, and the same again when the base of a LoRA run is written out later, one tensor
at a time (`outputs.weights.write_random_base`), only when something will read it.

The rows of tokens a recipe adds to the vocabulary are the mean of the other rows
(`components.vocab`); the embedding is built with a row for every token of the tokenizer so that no
resize is needed afterwards, and `RandomWeights` sets those rows on the whole tensor before any shard
is cut from it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Iterator

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass
    from transformers.quantizers import HfQuantizer

# Per-module attributes set on the skeleton; modules keep them through peft's wrapping and FSDP2's
# class swap, while the parameter objects themselves are replaced.
PREFIX = "_recipeforge_prefix"
QUANT = "_recipeforge_quant"
TOKEN_ROWS = "_recipeforge_token_rows"  # on the skeleton's root: names of the modules whose rows are tokens


@dataclass(frozen=True)
class RandomInit:
    """How a random-init model is made: its transformers config (vocabulary already grown to the
    tokenizer), the dtype of its weights, the seed, and the ids of the rows that start at the mean of
    the others. A record, so that the same weights can be made again (a LoRA run's base_model/)."""

    config: PretrainedConfig
    dtype: torch.dtype
    seed: int
    attn_implementation: str = "sdpa"
    num_labels: int | None = None
    new_rows: tuple[int, ...] = field(default=())


def module_seed(seed: int, name: str) -> int:
    """The seed of module `name` in a model seeded with `seed` (63 bits, stable across processes)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def model_class(config: PretrainedConfig, num_labels: int | None = None) -> type[_BaseAutoModelClass]:
    """The Auto class a random-init model of `config` is built with: image-text-to-text for a
    vision-language config, sequence classification when `num_labels` is given, else a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    from recipeforge.components.vision_model import is_vision_model

    if num_labels is not None:
        return AutoModelForSequenceClassification
    return AutoModelForImageTextToText if is_vision_model(config) else AutoModelForCausalLM


def build_skeleton(config: PretrainedConfig, *, dtype: torch.dtype, attn_implementation: str,
                   num_labels: int | None = None, quantization_config: object = None,
                   trust_remote_code: bool = False,
                   auto: type[_BaseAutoModelClass] | None = None) -> tuple[PreTrainedModel, HfQuantizer | None]:
    """The model of `config` with every parameter on the meta device, buffers real, 4-bit/8-bit
    linears in place when `quantization_config` is given, every module marked (`mark_modules`).
    Returns the model and the quantizer (None without quantization), whose `postprocess_model` the
    caller runs once the weights are in."""
    import copy

    from accelerate import init_empty_weights
    from transformers.modeling_utils import set_quantized_state

    config = copy.deepcopy(config)
    if num_labels is not None:
        config.num_labels = num_labels  # the same decoder with a `score` head of num_labels outputs
    auto = auto or model_class(config, num_labels)
    # Built outside deepspeed.zero.Init even while a ZeRO-3 config is alive (transformers skips it for
    # quantized models): the weights come later, made or read one module at a time.
    with init_empty_weights(include_buffers=False), set_quantized_state():
        model = auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation,
                                 trust_remote_code=trust_remote_code)
    quantizer = None
    if quantization_config is not None:
        from transformers.quantizers import AutoHfQuantizer

        # transformers' own quantizer: the same modules, skip list and settings a whole load gets.
        quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
        quantizer.preprocess_model(model=model, dtype=dtype, device_map={"": "cpu"})
    # Tied parameters become one object here (construction under `init_empty_weights` leaves them apart).
    model.tie_weights()
    mark_modules(model)
    # Which modules' rows are tokens, named now: peft's wrappers may stand in for them later.
    setattr(model, TOKEN_ROWS, _embedding_names(model))
    return model, quantizer


def mark_modules(model: torch.nn.Module) -> None:
    """Record on every module its name in the bare model and, for a bitsandbytes 4-bit layer, how
    its weight is quantized and its unpacked shape."""
    for name, module in model.named_modules():
        setattr(module, PREFIX, name)
        if is_4bit_layer(module):
            w = module.weight
            setattr(module, QUANT, {"blocksize": w.blocksize, "compress_statistics": w.compress_statistics,
                                    "quant_type": w.quant_type, "quant_storage": w.quant_storage,
                                    "shape": (module.out_features, module.in_features)})


def is_4bit_layer(module: torch.nn.Module) -> bool:
    """Whether `module` is bitsandbytes' 4-bit linear (not peft's LoRA wrapper of one, which has the
    same class name), told without importing bitsandbytes."""
    kind = type(module)
    return any(c.__name__ == "Linear4bit" and c.__module__.startswith("bitsandbytes") for c in kind.__mro__)


def marked_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(name in the bare model, module) of every marked module of `model`, in module order; a copy
    peft made of a module (modules_to_save) carries the same name."""
    for module in model.modules():
        prefix = getattr(module, PREFIX, None)
        if prefix is not None:
            yield prefix, module


def full_shape(module: torch.nn.Module, pname: str, param: torch.Tensor) -> tuple[int, ...]:
    """The shape of a parameter before quantization (a 4-bit weight is stored packed)."""
    quant = getattr(module, QUANT, None)
    if quant is not None and pname == "weight":
        return tuple(quant["shape"])
    return tuple(param.shape)


class RandomWeights:
    """The weights of a random-init model, made module by module (see the module docstring).

    `model`: the model whose marked modules are asked for (the skeleton, or the same model wrapped
    by peft or sharded by FSDP2); `device`: where tensors are made (the training device); `dtype`:
    the dtype of weights that are quantized afterwards (the compute dtype); other parameters are made
    in their own dtype."""

    def __init__(self, model: torch.nn.Module, spec: RandomInit, *, device: str | torch.device):
        self.spec, self.device = spec, device
        self._owners = _owners(model)
        roots = [m for m in model.modules() if hasattr(m, TOKEN_ROWS)]
        self._row_fitted = set(getattr(roots[0], TOKEN_ROWS)) if spec.new_rows and roots else set()

    def module_tensors(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Every direct parameter of `module`, whole, on the device, initialized by the owning model's
        `_init_weights` under the module's seed; raises when the model's initialization leaves one
        untouched (it would train from uninitialized memory)."""
        import torch

        prefix = getattr(module, PREFIX)
        owner = self._owners.get(id(module))
        originals = {n: p for n, p in module._parameters.items() if p is not None}
        made = {}
        for pname, param in originals.items():
            dtype = self.spec.dtype if (getattr(module, QUANT, None) and pname == "weight") or not \
                param.is_floating_point() else param.dtype
            # NaN until initialized: what `_init_weights` leaves untouched shows (floating point only).
            fill = float("nan") if dtype.is_floating_point else 0
            made[pname] = torch.nn.Parameter(torch.full(full_shape(module, pname, param), fill, dtype=dtype,
                                                        device=self.device), requires_grad=False)
        if owner is None or not made:
            return {}
        try:
            module._parameters.update(made)
            with torch.no_grad():
                seed_device(self.device, module_seed(self.spec.seed, prefix))
                owner._init_weights(module)
        finally:
            module._parameters.update(originals)
        out = {}
        for pname, tensor in made.items():
            data = tensor.data
            if data.is_floating_point() and bool(torch.isnan(data).any()):
                raise RecipeError(
                    f"random init: {type(owner).__name__}._init_weights leaves parameter '{prefix}.{pname}' "
                    f"({type(module).__name__}) uninitialized", key="model.init",
                    hint="this architecture cannot be initialized module by module; train it from a checkpoint "
                         "(model.init: pretrained)")
            if prefix in self._row_fitted and pname == "weight":
                mean_rows_(data, self.spec.new_rows)
            out[pname] = data
        return out


def materialize(model: torch.nn.Module, weights: RandomWeights, *, device: str | torch.device) -> dict[str, int]:
    """Give the skeleton `model` its weights, whole, on `device` (quantizing the weights of 4-bit and
    8-bit layers there, as transformers does when it loads them), and move its buffers there. Tied
    parameters stay one object. Returns the bytes made and the largest tensor's."""
    holders = _holders(model)
    # The skeleton's parameters, held until the end: tied ones are replaced through their first
    # holder, and their ids must not be reused by new objects meanwhile.
    originals = {id(p): p for p in model.parameters()}
    done: set[int] = set()
    stats = {"bytes": 0, "largest_tensor_bytes": 0}
    for _, module in marked_modules(model):
        todo = [n for n, p in module._parameters.items() if p is not None and id(p) in originals and id(p) not in done]
        if not todo:
            continue
        tensors = weights.module_tensors(module)
        for pname in todo:
            param = module._parameters[pname]
            full = tensors[pname]
            stats["largest_tensor_bytes"] = max(stats["largest_tensor_bytes"], full.numel() * full.element_size())
            new = as_parameter(param, full)
            stats["bytes"] += new.numel() * new.element_size()
            done.add(id(param))
            for other, other_name in holders[id(param)]:
                setattr(other, other_name, new)
    del originals
    for module in model.modules():
        for bname, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.device != device:
                module._buffers[bname] = buffer.to(device)
    return stats


def as_parameter(param: torch.Tensor, full: torch.Tensor) -> torch.nn.Parameter:
    """The parameter that replaces the skeleton's `param`, holding `full`: quantized by bitsandbytes
    for a 4-bit or 8-bit weight (the calls transformers' loading makes), else a plain parameter."""
    import torch

    kind = type(param).__name__
    if kind == "Params4bit":
        import bitsandbytes as bnb

        return bnb.nn.Params4bit(full, requires_grad=False, **param.__dict__).to(full.device)
    if kind == "Int8Params":
        import bitsandbytes as bnb

        kwargs = dict(param.__dict__)
        kwargs.pop("SCB", None)
        return bnb.nn.Int8Params(full.to("cpu"), requires_grad=False, **kwargs).to(full.device)
    return torch.nn.Parameter(full.to(param.dtype), requires_grad=param.requires_grad)


def mean_rows_(weight: torch.Tensor, ids: tuple[int, ...] | list[int]) -> None:
    """Set the rows `ids` of an embedding matrix to the mean of its other rows (in place)."""
    import torch

    ids = [i for i in ids if i < weight.shape[0]]
    if not ids:
        return
    keep = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    keep[ids] = False
    with torch.no_grad():
        weight[ids] = weight[keep].float().mean(dim=0).to(weight.dtype)


def seed_device(device: str | torch.device, seed: int) -> None:
    """Seed the default random generator of `device` (the CPU's, or one GPU's) and nothing else."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


def forked_rng(device: str | torch.device) -> ContextManager[None]:
    """A context that restores the random state of `device` (and the CPU's) when it ends: making
    weights does not move the random stream of whoever called."""
    import torch

    device = torch.device(device)
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def grown_vocab(config: PretrainedConfig, tokens: int) -> PretrainedConfig:
    """`config` with a row for each of `tokens` tokens when it has fewer (the text config of a
    vision-language model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "vocab_size", None) is not None and tokens > text.vocab_size:
        text.vocab_size = tokens
    return config


def _owners(root: torch.nn.Module) -> dict[int, PreTrainedModel | None]:
    """For every module of `root`, the nearest `PreTrainedModel` at or above it: the model whose
    `_init_weights` initializes it (transformers' `initialize_weights` dispatches the same way)."""
    from transformers import PreTrainedModel

    owners: dict[int, Any] = {}
    stack = [(root, None)]
    while stack:
        module, owner = stack.pop()
        if isinstance(module, PreTrainedModel):
            owner = module
        owners[id(module)] = owner
        stack.extend((child, owner) for child in module.children())
    return owners


def _embedding_names(model: torch.nn.Module) -> set[str]:
    """The marked names of the input embedding and the output layer (their rows are tokens)."""
    base = model
    while not hasattr(base, "get_input_embeddings") and hasattr(base, "model"):
        base = base.model
    names = set()
    for module in (base.get_input_embeddings(), base.get_output_embeddings()):
        if module is not None and getattr(module, PREFIX, None) is not None:
            names.add(getattr(module, PREFIX))
    return names


def _holders(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """Every (module, name) holding each parameter object: tied weights have several."""
    holders: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for pname, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, pname))
    return holders
