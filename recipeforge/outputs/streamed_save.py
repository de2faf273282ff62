"""final/ of a sharded model written tensor by tensor: the full state dict is never gathered.

Every process walks the model's sharded state dict in the same order (`ShardedWeights`: DTensors of
FSDP2 and tensor parallel, `dtensor_weights`; ZeRO-3's partitioned parameters, `zero3_weights`); each
tensor is gathered whole on every process (`DTensor.full_tensor()`, `deepspeed.zero.GatheredParameters`:
collectives), cast to final/'s dtype, and the main process copies it to the host and appends its bytes
to the safetensors file it belongs to, then drops it. The main process's host memory holds one tensor
at a time (plus the process), whatever the model's size, where a gathered save holds the whole model.

The result is the folder `save_pretrained(max_shard_size=...)` writes from the gathered state dict:
the same file names (`model.safetensors`, or `model-0000i-of-0000N.safetensors` with
`model.safetensors.index.json`), the same tensors in the same files (the split is huggingface_hub's
`split_torch_state_dict_into_shards`, run on shape-only meta tensors), tied weights and ignored keys
dropped as transformers drops them, renamed keys (a checkpoint layout that differs from the modules'
names) renamed back, and config.json, generation_config.json and remote code written by
`save_pretrained` itself. A model whose checkpoint layout needs tensors combined (transformers' weight
converters, e.g. fused MoE experts split back into one tensor per expert) cannot be written a tensor at
a time: `plan_files` returns None and the caller gathers the state dict as before.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
    import torch

# safetensors' names of torch dtypes
_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
           "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
           "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32",
           "uint64": "U64"}
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class FilePlan:
    """Which tensor goes where: `files` maps each file name to its (saved name, source key) pairs in
    the order their bytes are written; `shapes` the saved tensors' meta tensors (shape, dtype);
    `index`: model.safetensors.index.json's content, or None for a single file."""

    files: dict[str, list[tuple[str, str]]]
    shapes: dict[str, Any]
    index: dict[str, Any] | None


@dataclass(frozen=True)
class ShardedWeights:
    """A sharded model's weights as every process holds them: `state` maps each state-dict key to what
    this process keeps of it, `shape` gives an entry's full shape, and `gather(entry, dtype)` returns
    it whole in `dtype` (a collective: every process calls it for the same entry, in the same order)."""

    state: dict[str, Any]
    shape: Callable[[Any], tuple[int, ...]]
    gather: Callable[[Any, Any], Any]


def dtensor_weights(model: torch.nn.Module) -> ShardedWeights:
    """FSDP2 and tensor parallel: the model's state dict as each process holds it (DTensor shards,
    nothing gathered), under the names a plain model has (wrappers' prefixes such as activation
    checkpointing's removed)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    return ShardedWeights(state, lambda t: tuple(t.shape), _full_dtensor)


def _full_dtensor(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to(dtype)


def zero3_weights(model: torch.nn.Module) -> ShardedWeights:
    """DeepSpeed ZeRO-3: the module's parameters are partitioned placeholders (`ds_shape` their full
    shape), gathered one at a time with `deepspeed.zero.GatheredParameters`; buffers are whole."""
    state = model.state_dict(keep_vars=True)
    return ShardedWeights(state, lambda t: tuple(getattr(t, "ds_shape", t.shape)), _full_zero3)


def _full_zero3(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not hasattr(tensor, "ds_id"):
        return tensor.detach().to(dtype)
    import deepspeed

    with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
        # a copy: the gathered storage is released when the block ends
        return tensor.data.detach().to(dtype, copy=True)


# How a backend keeps its weights -> the `ShardedWeights` of a model it holds (`backends.base.streamed_final_save`)
SHARDINGS: dict[str, Callable[[Any], ShardedWeights]] = {"dtensor": dtensor_weights, "zero3": zero3_weights}


def saved_dtype(key: str, tensor: torch.Tensor, dtype: torch.dtype | None, keep: tuple[str, ...]) -> torch.dtype:
    """The dtype `key` is written in: fp32 tensors in `dtype` (final/'s 16-bit dtype) unless a module
    the model keeps in fp32 holds them, as `outputs.weights.weights_in` casts a gathered state dict."""
    import torch

    if dtype is not None and tensor.dtype == torch.float32 and not any(k in key.split(".") for k in keep):
        return dtype
    return tensor.dtype


def plan_files(model: PreTrainedModel, weights: ShardedWeights, dtype: torch.dtype | None, max_shard_size: int) -> FilePlan | None:
    """Where `save_pretrained` would put each tensor of `weights`, worked out on meta tensors of the
    full shapes, without gathering anything. `model`: the transformers model (unwrapped). None when
    its checkpoint layout combines tensors (weight converters)."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) \
        + tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    meta = {key: torch.empty(weights.shape(t), dtype=saved_dtype(key, t, dtype, keep), device="meta")
            for key, t in weights.state.items()}
    for ignored in getattr(model, "_keys_to_ignore_on_save", None) or ():
        meta.pop(ignored, None)
    source = {id(t): key for key, t in meta.items()}
    # The same steps as save_pretrained: tied copies out, then the modules' names back to the checkpoint's.
    saved = revert_weight_conversion(model, remove_tied_weights_from_state_dict(dict(meta), model))
    names = {name: source.get(id(t)) for name, t in saved.items()}
    if any(key is None for key in names.values()):
        return None  # a tensor made from others: only a gathered state dict can be converted
    split = split_torch_state_dict_into_shards(saved, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=max_shard_size)
    files: dict[str, list[tuple[str, str]]] = {}
    for file, tensors in split.filename_to_tensors.items():
        # Bytes ordered as safetensors orders them (widest dtype first, then by name), so every tensor
        # starts at an offset aligned to its element size.
        ordered = sorted(tensors, key=lambda n: (-saved[n].element_size(), n))
        files[file] = [(n, str(names[n])) for n in ordered]
    index = None
    if split.is_sharded:
        index = {"metadata": {"total_parameters": model.num_parameters(), **split.metadata},
                 "weight_map": split.tensor_to_filename}
    return FilePlan(files, saved, index)


def _header(entries: list[tuple[str, Any]], metadata: dict[str, str]) -> tuple[bytes, list[int]]:
    """safetensors' header for `entries` (name, meta tensor) in that order, padded with spaces to 8
    bytes as safetensors pads it, and each tensor's byte size."""
    header: dict[str, Any] = {"__metadata__": metadata}
    sizes, offset = [], 0
    for name, t in entries:
        kind = _DTYPES.get(str(t.dtype).removeprefix("torch."))
        if kind is None:
            raise ValueError(f"{name}: safetensors has no dtype for {t.dtype}")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        sizes.append(size)
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, sizes


def write_weights(folder: Path | None, plan: FilePlan, weights: ShardedWeights,
                  metadata: dict[str, str] | None = None) -> None:
    """Gather each tensor of `weights` in `plan`'s order and, where `folder` is given (the main process),
    write it into its file there. Every process calls this; the others only take part in the gathers."""
    import torch

    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this host is not")
    for file, entries in plan.files.items():
        shapes = [(name, plan.shapes[name]) for name, _ in entries]
        header, sizes = _header(shapes, metadata or {"format": "pt"})
        with (open(folder / file, "wb") if folder is not None else _Discard()) as out:
            out.write(header)
            for (name, key), (_, meta), size in zip(entries, shapes, sizes):
                with torch.no_grad():
                    whole = weights.gather(weights.state[key], meta.dtype)
                if folder is None:
                    del whole
                    continue
                if tuple(whole.shape) != tuple(meta.shape):
                    raise RuntimeError(f"{key}: gathered {tuple(whole.shape)}, planned {tuple(meta.shape)}")
                host = whole.to("cpu").contiguous()
                del whole
                data = host.reshape(-1).view(torch.uint8).numpy() if size else b""
                out.write(memoryview(data))
                del host, data
    if folder is not None and plan.index is not None:
        (folder / INDEX_NAME).write_text(json.dumps(plan.index, indent=2, sort_keys=True) + "\n")


class _Discard:
    """A file that keeps nothing: the processes that only take part in the gathers."""

    def __enter__(self) -> _Discard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, data: bytes | memoryview) -> int:
        return 0


def save_streamed(model: PreTrainedModel, weights: ShardedWeights, tokenizer: PreTrainedTokenizerBase | ProcessorMixin, out: Path, *, is_main: bool,
                  dtype: torch.dtype | None, max_shard_size: int) -> Path | None:
    """Write final/ (`out`) from `weights` tensor by tensor; `model`: the model they belong to,
    unwrapped (its config, generation config and checkpoint names). Every process calls this. Returns
    None, having written nothing, when the model's checkpoint layout needs the gathered state dict
    (`plan_files`); the same answer on every process, since it depends on shapes and names alone."""
    from recipeforge.outputs.weights import save_config_files, staged_folder

    plan = plan_files(model, weights, dtype, max_shard_size)
    if plan is None:
        return None
    if not is_main:
        write_weights(None, plan, weights)
        return out
    with staged_folder(out) as tmp:
        save_config_files(model, tmp, dtype)
        write_weights(tmp, plan, weights)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return out
