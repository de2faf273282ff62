"""Loading a base for FSDP2 and DeepSpeed ZeRO-3 with no process ever holding the whole of it: a
4-bit (QLoRA) base read from a checkpoint, or any random-init base (`components.model_init`).

transformers loads a bitsandbytes-quantized model whole on every process, even under FSDP (its
rank-0-only loading skips quantized models: transformers/modeling_utils.py, `is_fsdp_enabled() and
not is_local_dist_rank_0() and not is_quantized`) and ZeRO-3 (it builds quantized models outside
`deepspeed.zero.Init`), so a 70B base cannot fit next to its shards; and a random-init model built by
`from_config` is built whole on every process. Here every process holds only its shard, in three
steps around the sharding (FSDP2; ZeRO-3 below):

1. `build_placeholder_model` (the backend's `load_sharded`): the model's skeleton
   (`components.model_init.build_skeleton`: bitsandbytes' `Linear4bit` layers in place for QLoRA,
   transformers' own quantizer replacing the linears as for a whole load), every weight a
   placeholder: one element expanded to the full shape (of the packed words, for 4-bit weights).
   The stage freezes it and peft adds the adapters, on the CPU next to the placeholders, initialized
   as always.
2. `placeholders_to_meta` and the trainer's Accelerator (`shard_with_accelerator`): the
   placeholders become meta tensors and the same `fully_shard` calls a whole model gets shard them
   into meta shards, allocating nothing; the adapters are sharded as usual.
3. `fill_local_shards`: the base's tensors come one at a time, read from the checkpoint or made by
   `RandomWeights` (one module at a time, whole, on the training device, under the module's own seed:
   the same values as on one process); a weight of a 4-bit layer is quantized whole (bitsandbytes'
   `quantize_4bit`, the call a whole load makes, so the words are the same) and only this process's
   rows are kept, next to the small quantization state (absmax, ...) every process needs to
   dequantize the gathered weight.

Under ZeRO-3 (`partition_and_fill`) steps 2 and 3 are one: no engine shards the model before the
trainer starts it, so the tensors go one at a time into the placeholder model and each, once
quantized, is handed to DeepSpeed's own partitioning (`zero3_partitioner`: what
`deepspeed.zero.Init` does to an allocated module), which keeps this process's slice of the flat
words (`ds_tensor`) and frees the rest. The parameter object stays the same, so bitsandbytes'
quant_state, set on it and on its layer, is there when ZeRO-3 gathers the weight for a forward; the
engine, when it starts, partitions the adapters with the same partitioner.

A process holds its shards, the quantization states and, at the peak, one full tensor (a module's
tensors, for random init) and its quantized copy. Checkpoints whose tensor names are not the model's
parameter names (those transformers converts at load, e.g. fused experts) are refused with an error.
Each process writes what it held to `sharded_loading/rank<N>.json` in the run directory.

The worker hooks that run these steps (the stage's loader, `shard_with_accelerator`, `partition_and_fill`) are
in `sharded_hooks`; the checkpoint is read through `checkpoint_reading`, memory measured by `process_memory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from recipeforge.backends.checkpoint_reading import checkpoint_files, read_tensor
from recipeforge.backends.process_memory import released_rss_bytes
from recipeforge.components.model_init import PREFIX, QUANT, RandomInit, is_4bit_layer, marked_modules

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor import DTensor
    from bitsandbytes.functional import QuantState
    from transformers import PreTrainedModel

    # `keep(module, name, param, full)` of `fill_base`: stores this process's part of `full` as `param`
    # of `module`; returns the parameter now registered there and the local tensor it holds.
    Keep = Callable[["torch.nn.Module", str, "torch.nn.Parameter", "torch.Tensor"],
                    tuple["torch.Tensor | None", "torch.Tensor"]]

# On the model's root: where its base comes from (a checkpoint path, or a `RandomInit`), and the
# checkpoint names of tied parameters.
_SOURCE = "_sharded_loading_source"
_ALIASES = "_sharded_loading_aliases"


def build_placeholder_model(path: str | None, quantization_config: object, *, dtype: torch.dtype,
                            attn_implementation: str, trust_remote_code: bool = False, name: str | None = None,
                            random: RandomInit | None = None) -> Any:
    """The model of the checkpoint in the local directory `path` (or of the random-init `random`) with
    4-bit linears when `quantization_config` is given and placeholder weights (module docstring);
    `fill_local_shards` gives it its weights once it is sharded. `name` (default: `path`) is the name
    the model goes by, which peft writes into the adapter's config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from recipeforge.components.model_init import build_skeleton

    if random is not None:
        model, quantizer = build_skeleton(random.config, dtype=dtype, attn_implementation=attn_implementation,
                                          num_labels=random.num_labels, quantization_config=quantization_config)
    else:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        model, quantizer = build_skeleton(config, dtype=dtype, attn_implementation=attn_implementation,
                                          quantization_config=quantization_config,
                                          trust_remote_code=trust_remote_code, auto=AutoModelForCausalLM)
    _replace_with_placeholders(model)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if quantizer is not None:
        quantizer.postprocess_model(model)  # config.quantization_config, is_loaded_in_4bit: what peft reads
        model.hf_quantizer = quantizer
    model.config._name_or_path = model.name_or_path = str(name or path)
    setattr(model, _SOURCE, random if random is not None else str(path))
    setattr(model, _ALIASES, _tied_aliases(model))
    return model


def packed_shape(shape: tuple[int, ...], quant_storage: torch.dtype) -> tuple[int, int]:
    """The shape of a 4-bit weight of `shape` packed into `quant_storage` words (bitsandbytes'
    `quantize_4bit`: two 4-bit values a byte, one column)."""
    import math

    import torch

    per_word = 2 * torch.empty((), dtype=quant_storage).element_size()
    return ((math.prod(shape) + 1) // per_word, 1)


def _placeholder(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` that takes one element of memory (every element is the same zero)."""
    import torch

    return torch.zeros((1,) * len(shape), dtype=dtype).expand(*shape)


def _replace_with_placeholders(model: torch.nn.Module) -> None:
    """Swap every meta parameter for a placeholder; tied parameters stay one object."""
    import torch

    done: dict[int, Any] = {}
    for module in model.modules():
        for pname, param in list(module.named_parameters(recurse=False)):
            if id(param) not in done:
                if is_4bit_layer(module) and pname == "weight":
                    import bitsandbytes as bnb

                    q = getattr(module, QUANT)
                    data = _placeholder(packed_shape(param.shape, q["quant_storage"]), q["quant_storage"])
                    new = bnb.nn.Params4bit(data, requires_grad=False, blocksize=q["blocksize"],
                                            compress_statistics=q["compress_statistics"],
                                            quant_type=q["quant_type"], quant_storage=q["quant_storage"],
                                            module=module, bnb_quantized=True)
                else:
                    # Trainable as built (a full fine-tune); the stage or peft freezes what stays frozen.
                    new = torch.nn.Parameter(_placeholder(param.shape, param.dtype), requires_grad=param.requires_grad)
                done[id(param)] = new
            setattr(module, pname, done[id(param)])


def placeholders_to_meta(model: torch.nn.Module) -> int:
    """Swap the placeholders for parameters on the meta device, right before sharding: FSDP2 takes
    only contiguous parameters, and shards meta ones into meta shards without allocating anything.
    (The placeholders were real CPU tensors until then so that peft put the adapters on the CPU.)
    Returns how many were swapped."""
    import torch

    done: dict[int, Any] = {}
    for module in model.modules():
        for pname, param in list(module.named_parameters(recurse=False)):
            if not _is_placeholder(param):
                continue
            if id(param) not in done:
                data = torch.empty(param.shape, dtype=param.dtype, device="meta")
                if type(param).__name__ == "Params4bit":
                    import bitsandbytes as bnb

                    q4: Any = param  # bitsandbytes' Params4bit, with its quantization settings
                    new = bnb.nn.Params4bit(data, requires_grad=False, blocksize=q4.blocksize,
                                            compress_statistics=q4.compress_statistics, quant_type=q4.quant_type,
                                            quant_storage=q4.quant_storage, module=module, bnb_quantized=True)
                else:
                    new = torch.nn.Parameter(data, requires_grad=param.requires_grad)
                done[id(param)] = new
            setattr(module, pname, done[id(param)])
    return len(done)


def _is_placeholder(param: torch.Tensor) -> bool:
    """An expanded one-element tensor: stride 0 along every dimension longer than one."""
    sizes = [(size, st) for size, st in zip(param.shape, param.stride()) if size > 1]
    return param.device.type != "meta" and bool(sizes) and all(st == 0 for _, st in sizes)


def fill_local_shards(model: torch.nn.Module, source: str | RandomInit, *, compute_dtype: torch.dtype | None,
                      device: torch.device | str | None = None,
                      shard_device: torch.device | str | None = None) -> dict[str, int]:
    """Give the local shards of `model` (its base on the meta device, sharded by FSDP2) their values,
    tensor by tensor from `source` (a checkpoint directory, or a `RandomInit`). Every weight of a 4-bit
    layer is quantized whole, then only this process's part of its packed words is kept. Returns what
    this process held (`fill_base`).

    `device` (default: the CPU) is where each tensor is quantized, the training device: on a GPU the
    words are those a whole load onto that GPU gets, and the quantization state lives where the
    layer computes. `shard_device` (default: `device`) is where the shards stay: the CPU when FSDP2
    offloads parameters."""
    holders = _holders(model)

    def keep(module: torch.nn.Module, pname: str, param: torch.nn.Parameter,
             full: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        part = _local_part(param, full, shard_device or device or "cpu")
        # assign=True: the shard becomes the parameter (no copy), and FSDP2's hook on the module
        # re-registers it as the sharded parameter (`FSDPParam.reset_sharded_param`).
        module.load_state_dict({pname: part}, strict=False, assign=True)
        return _retie(module, pname, holders[id(param)]), _local(part)

    return fill_base(model, source, compute_dtype=compute_dtype, device=device, keep=keep)


def fill_zero3_partitions(model: torch.nn.Module, source: str | RandomInit, *, compute_dtype: torch.dtype | None,
                          ds_config: dict[str, Any], device: torch.device | str | None = None) -> dict[str, int]:
    """Give the placeholder `model` its base tensor by tensor from `source` (a checkpoint directory,
    or a `RandomInit`), handing every tensor (a 4-bit layer's weight quantized whole, on `device`) to
    DeepSpeed's ZeRO-3 partitioning, which keeps this process's slice (`ds_tensor`) and frees the
    rest. Returns what this process held (`fill_base`)."""
    partition = zero3_partitioner(ds_config)
    dtype = engine_dtype(ds_config)

    def keep(module: torch.nn.Module, pname: str, param: torch.nn.Parameter,
             full: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        # The placeholder object stays the parameter: tied holders, peft's wrappers and the 4-bit
        # state on it keep pointing at what ZeRO-3 partitions and later gathers. Other tensors take
        # the engine's dtype, which it gives a model loaded whole (`in_engine_dtype`).
        if dtype is not None and type(param).__name__ != "Params4bit" and full.is_floating_point():
            full = full.to(dtype)
        param.data = full
        partition([param])
        partitioned: Any = param  # a ZeRO-3 parameter now: DeepSpeed's attributes on it
        return param, partitioned.ds_tensor

    return fill_base(model, source, compute_dtype=compute_dtype, device=device, keep=keep)


def engine_dtype(ds_config: dict[str, Any]) -> torch.dtype | None:
    """The dtype DeepSpeed trains the model's weights in under `ds_config` (bf16, fp16), or None (fp32)."""
    import torch

    for key, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if str((ds_config.get(key) or {}).get("enabled", False)).lower() == "true":
            return dtype
    return None


def in_engine_dtype(model: torch.nn.Module, ds_config: dict[str, Any]) -> int:
    """Give the parameters of `model` not yet ZeRO-3 partitioned (the adapters and peft's trainable
    copies, modules_to_save, which peft keeps in fp32) the dtype the DeepSpeed engine computes in, as
    the engine itself does to a model loaded whole (`module.bfloat16()`) but not to one already
    partitioned; in fp32 they would meet its 16-bit activations. The base was partitioned in that
    dtype (`fill_zero3_partitions`); 4-bit weights (packed words) are left alone. Returns how many
    were cast."""
    dtype = engine_dtype(ds_config)
    if dtype is None:
        return 0
    cast = 0
    for param in model.parameters():
        if type(param).__name__ == "Params4bit" or not param.is_floating_point():
            continue
        if hasattr(param, "ds_tensor"):  # the base's: partitioned in this dtype (`fill_zero3_partitions`)
            continue
        if param.dtype != dtype:
            param.data = param.data.to(dtype)
            cast += 1
    return cast


def zero3_partitioner(ds_config: dict[str, Any]) -> Callable[[list[torch.nn.Parameter]], None]:
    """DeepSpeed's conversion of allocated parameters into ZeRO-3 ones (each process keeps its
    slice of the flat tensor), as `deepspeed.zero.Init(module=...)` applies it to a whole model.

    One `Init` is made for all tensors, from the trainer's DeepSpeed config (offload device, process
    group, persistence), as the engine would make it; the engine later converts the adapters with
    the same object (`DeepSpeedZeRoOffload._convert_to_zero_parameters` asks an already converted
    parameter). It is made with an empty module so that it also installs DeepSpeed's ZeRO-3 linear
    function, as the engine's own `Init(module=model)` does for a model loaded whole."""
    import deepspeed
    import torch

    init = deepspeed.zero.Init(module=torch.nn.Module(), config_dict_or_path=ds_config)
    # deepspeed/runtime/zero/partition_parameters.py `Init._convert_to_zero_parameters`: the one
    # entry that partitions given parameters (broadcast from the first process, then `partition`).
    convert: Callable[[list[torch.nn.Parameter]], None] = init._convert_to_zero_parameters
    return convert


class CheckpointTensors:
    """The base's tensors read one at a time from the checkpoint in a local directory."""

    def __init__(self, model: torch.nn.Module, path: str):
        self.files = checkpoint_files(path)
        self.aliases: dict[str, str] = getattr(_find(model, _ALIASES), _ALIASES, {})
        self.held_bytes = 0  # nothing is kept between tensors

    def tensor(self, module: torch.nn.Module, pname: str, name: str) -> torch.Tensor:
        return read_tensor(self.files, name, self.aliases)


class RandomTensors:
    """The base's tensors made by `RandomWeights` on `device`, a module at a time (a module's other
    tensors wait, made, until asked for)."""

    def __init__(self, model: torch.nn.Module, spec: RandomInit, device: torch.device | str | None):
        import torch

        from recipeforge.components.model_init import RandomWeights

        self.weights = RandomWeights(model, spec, device=torch.device(device or "cpu"))
        self._module: torch.nn.Module | None = None
        self._made: dict[str, torch.Tensor] = {}

    @property
    def held_bytes(self) -> int:
        return sum(_nbytes(t) for t in self._made.values())

    def tensor(self, module: torch.nn.Module, pname: str, name: str) -> torch.Tensor:
        if module is not self._module:
            self._module, self._made = module, self.weights.module_tensors(module)
        return self._made.pop(pname)


def tensor_source(model: torch.nn.Module, source: str | RandomInit,
                  device: torch.device | str | None = None) -> CheckpointTensors | RandomTensors:
    """Where the base of `model` comes from: a checkpoint directory, or a `RandomInit`."""
    if isinstance(source, RandomInit):
        return RandomTensors(model, source, device)
    return CheckpointTensors(model, str(source))


def fill_base(model: torch.nn.Module, source: str | RandomInit, *, compute_dtype: torch.dtype | None, keep: Keep,
              device: torch.device | str | None = None) -> dict[str, int]:
    """Give the base of `model` (its placeholder or meta parameters) its tensors one at a time from
    `source` (a checkpoint directory, or a `RandomInit`, `tensor_source`): a weight of a 4-bit layer is
    quantized whole on `device` (default: the CPU), any other tensor converted to its parameter's
    dtype, and `keep(module, name, param, full)` stores this process's part of it, returning the
    parameter now registered and the local tensor it holds. The RNG state of `device` is restored
    afterwards (random init seeds it per module).

    Returns what this process held: bytes of its parts, of the whole base, of the quantization
    states, of the largest tensor made or read, the most base bytes alive at once, and the highest
    resident size sampled (`released_rss_bytes`) while filling (`rss_peak_bytes`)."""
    import torch

    from recipeforge.components.model_init import forked_rng

    tensors = tensor_source(model, source, device)
    done: set[int] = set()
    stats = {"local_base_bytes": 0, "full_base_bytes": 0, "quant_state_bytes": 0, "largest_tensor_bytes": 0,
             "peak_live_base_bytes": 0, "rss_peak_bytes": released_rss_bytes()}
    with torch.no_grad(), forked_rng(torch.device(device or "cpu")):
        # Marked modules are the base's; a modules_to_save copy made by peft is a deep copy of one
        # (mark included; the copy made its placeholder a real tensor of zeros) and starts from the
        # same weights. Adapters carry no mark and keep their initialization.
        for prefix, module in marked_modules(model):
            for pname, param in list(module.named_parameters(recurse=False)):
                if id(param) in done:
                    continue
                done.add(id(param))
                name = f"{prefix}.{pname}" if prefix else pname
                full = tensors.tensor(module, pname, name)
                read_bytes = _nbytes(full) + tensors.held_bytes
                stats["largest_tensor_bytes"] = max(stats["largest_tensor_bytes"], _nbytes(full))
                if getattr(module, QUANT, None) is not None and pname == "weight":
                    full, state_bytes = _quantize(module, full.to(device or "cpu", compute_dtype))
                    stats["quant_state_bytes"] += state_bytes
                else:
                    full = full.to(param.dtype)
                _check_shape(name, full, param)
                numel = param.numel()  # before `keep`: a partitioned parameter's own size is 0
                kept, local = keep(module, pname, param, full)
                # What is alive at this moment: the parts so far, the tensor read or made (and its
                # module's others), its converted copy and this part (an upper bound: the read
                # tensor may already be gone).
                live = stats["local_base_bytes"] + stats["quant_state_bytes"] + read_bytes + _nbytes(full)
                stats["peak_live_base_bytes"] = max(stats["peak_live_base_bytes"], live + _nbytes(local))
                stats["rss_peak_bytes"] = max(stats["rss_peak_bytes"], released_rss_bytes())  # with `full` alive
                del full
                stats["full_base_bytes"] += numel * param.element_size()
                stats["local_base_bytes"] += _nbytes(local)
                done.add(id(kept))
    return stats


def _check_shape(name: str, full: torch.Tensor, param: torch.Tensor) -> None:
    if tuple(full.shape) != tuple(param.shape):  # e.g. embeddings grown for added tokens
        raise ValueError(f"checkpoint tensor '{name}' has shape {tuple(full.shape)}, the model "
                         f"{tuple(param.shape)}: sharded 4-bit loading takes the checkpoint's shapes as "
                         f"they are (no tokens added to the vocabulary)")


def _holders(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """Every (module, name) holding each parameter object: tied weights have several."""
    holders: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for pname, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, pname))
    return holders


def _retie(module: torch.nn.Module, pname: str,
           holders: list[tuple[torch.nn.Module, str]]) -> torch.nn.Parameter | None:
    """Give the other holders of a tied parameter the one just loaded (FSDP2 then registers it as
    the sharded parameter of all of them at its lazy initialization); returns it."""
    loaded = module._parameters[pname]
    for other, other_name in holders:
        if other is not module:
            setattr(other, other_name, loaded)
    return loaded


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _local(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param.data


def _local_part(param: torch.Tensor, full: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """This process's part of `full` as `param` holds it: for a DTensor, the rows FSDP2 gave this
    process (its placements say which, on any mesh), in storage of their own."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(param, DTensor):
        return full.to(device, copy=True)
    shape, offset = compute_local_shape_and_global_offset(full.shape, param.device_mesh, param.placements)
    part = full
    for dim, (start, size) in enumerate(zip(offset, shape)):
        part = part.narrow(dim, start, size)
    local = part.to(device, _local(param).dtype, copy=True).contiguous()
    return _dtensor_like(local, param)


def _dtensor_like(local: torch.Tensor, like: DTensor) -> DTensor:
    """A DTensor of `local` laid out as the DTensor `like`, left on `local`'s device. (`DTensor.from_local`
    would move it to the mesh's device type: a CPU shard of a CUDA mesh, as FSDP2's CPU offload keeps
    them, would land on the GPU, and FSDP2 refuses offloaded parameters off the CPU. FSDP2 builds its
    own sharded parameters this way.)"""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import _from_local_no_grad
    except ImportError:  # an older layout of torch's FSDP2 package
        from torch.distributed.tensor import DTensor

        make: Callable[..., DTensor] = DTensor  # torch declares its constructor without types
        return make(local, like._spec, requires_grad=local.requires_grad)
    return _from_local_no_grad(local, like._spec)


def _quantize(module: torch.nn.Module, weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """bitsandbytes' 4-bit quantization of a whole weight (as transformers does when it loads one);
    the state goes on the module, where its 4-bit layer finds it after FSDP2 replaced the weight."""
    import bitsandbytes as bnb

    q = getattr(module, QUANT)
    packed, state = bnb.functional.quantize_4bit(weight.contiguous(), blocksize=q["blocksize"],
                                                 compress_statistics=q["compress_statistics"],
                                                 quant_type=q["quant_type"], quant_storage=q["quant_storage"])
    module.quant_state = state
    if hasattr(module.weight, "quant_state"):
        module.weight.quant_state = state
    return packed, sum(t.numel() * t.element_size() for t in _state_tensors(state))


def _state_tensors(state: QuantState) -> list[torch.Tensor]:
    tensors = [state.absmax]
    if getattr(state, "state2", None) is not None:
        tensors += [state.state2.absmax, state.state2.code]
    return [t for t in tensors if t is not None]


def _tied_aliases(model: PreTrainedModel) -> dict[str, str]:
    """Output layer weight -> embedding weight, for a model whose output layer is tied to its
    embeddings (checkpoints store the tensor once). A modules_to_save copy of the output layer has
    its own weight, started from the same tensor."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    embeddings, output = model.get_input_embeddings(), model.get_output_embeddings()
    if embeddings is None or output is None:
        return {}
    return {f"{getattr(output, PREFIX)}.weight": f"{getattr(embeddings, PREFIX)}.weight"}


def base_source(model: torch.nn.Module) -> str | RandomInit | None:
    """Where a placeholder model's base comes from (a checkpoint directory or a `RandomInit`; peft
    wraps it: look inside), or None for a model loaded another way."""
    source: str | RandomInit | None = getattr(_find(model, _SOURCE), _SOURCE, None)
    return source


def _find(model: torch.nn.Module, attribute: str) -> torch.nn.Module | None:
    """The module of `model` (itself or one inside a wrapper) that has `attribute`, or None."""
    return next((m for m in model.modules() if getattr(m, attribute, None)), None)
