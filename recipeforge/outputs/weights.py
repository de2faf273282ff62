"""Writing trained models: final/ (full weights or adapter), base_model/, each folder written whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


@contextlib.contextmanager
def staged_folder(out: Path, *, kind: str | None = None) -> Iterator[Path]:
    """A staging sibling of `out` to write a folder into. When the block ends normally it replaces `out`
    with one rename; on any error (Ctrl-C and, under `ownership.stop_on_sigterm`, SIGTERM included) it
    is removed and `out` stays as it was.

    `kind` (export, merged): `out` is an output folder of its own, marked as recipeforge's, and an
    existing one is replaced only when recipeforge wrote it (`ownership.remove_owned`). Without it, `out`
    is a fixed part of a run directory or cache entry (final/, base_model/), replaced with what holds it."""
    from recipeforge.outputs.ownership import mark_owned, remove_owned, staging_folder

    tmp = staging_folder(out.parent, out.name[:40])
    try:
        yield tmp
        if kind is not None:
            mark_owned(tmp, kind)
            remove_owned(out)
        elif out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def save_pretrained_atomic(model, tokenizer, out: Path, state_dict: dict | None = None, dtype=None,
                           kind: str | None = None, max_shard_size: int | str | None = None) -> Path:
    """`save_pretrained` (safetensors) + tokenizer into `out`, replacing it only once fully written.
    `state_dict`: weights gathered from a sharded model (ZeRO-3, FSDP) to write instead of the model's.
    `dtype`: a 16-bit torch dtype to write fp32 full weights in (`weights_in`); adapters are written as
    peft keeps them. `max_shard_size`: the largest weights file (`output.max_shard_size`; default
    transformers')."""
    if dtype is not None and not is_peft(model):
        state_dict, dtype = weights_in(model, state_dict, dtype)
    sizing = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    with staged_folder(out, kind=kind) as tmp:
        # A gathered state dict is written by the main process alone: a tensor-parallel model's own
        # distributed save (transformers ends it with a barrier of every rank) must not run then.
        with _saving(model, alone=state_dict is not None):
            model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True, **sizing)
        if dtype is not None:
            _config_dtype(tmp / "config.json", dtype)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return out


def save_config_files(model, folder: Path, dtype=None) -> None:
    """What `save_pretrained` writes besides the weights (config.json with the architecture,
    generation_config.json, a remote-code model's code), into `folder`, written by transformers itself
    (a save of no tensors, whose empty weights file is removed). Main process only. `dtype`: the
    weights' dtype recorded in config.json (see `save_pretrained_atomic`)."""
    with _saving(model, alone=True):
        model.save_pretrained(str(folder), state_dict={}, safe_serialization=True)
    (folder / "model.safetensors").unlink(missing_ok=True)
    if dtype is not None:
        _config_dtype(folder / "config.json", dtype)


@contextlib.contextmanager
def _saving(model, *, alone: bool) -> Iterator[None]:
    """The model's config as final/ records it while it is saved: the KV cache on (training turns it
    off; users of the model want it), and no distributed config when the main process saves alone."""
    config = getattr(model, "config", None)
    cache_flag = getattr(config, "use_cache", None)
    distributed = getattr(config, "distributed_config", None) if alone else None
    if config is not None:
        config.use_cache = True
        if distributed is not None:
            config.distributed_config = None
    try:
        yield
    finally:
        if config is not None and cache_flag is not None:
            config.use_cache = cache_flag
        if distributed is not None:
            config.distributed_config = distributed


def weights_in(model, state_dict: dict | None, dtype) -> tuple[dict | None, object]:
    """`state_dict` (default: the model's) with its fp32 tensors in `dtype`, on the CPU, and `dtype`;
    or (`state_dict`, None) when no tensor is fp32. Modules the model keeps in fp32 whatever its dtype
    (transformers' `_keep_in_fp32_modules`) stay fp32, and tensors sharing storage (tied weights)
    still share it, so transformers drops the tied copy as it does for the model's own weights."""
    import torch

    source = state_dict if state_dict is not None else model.state_dict()
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) \
        + tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    cast: dict[tuple, object] = {}
    out = {}
    for name, tensor in source.items():
        if tensor.dtype != torch.float32 or any(k in name.split(".") for k in keep):
            out[name] = tensor
            continue
        alias = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if alias not in cast:
            cast[alias] = tensor.detach().to("cpu", dtype)
        out[name] = cast[alias]
    return (out, dtype) if cast else (state_dict, None)


def _config_dtype(config_json: Path, dtype) -> None:
    """Record `dtype` as the weights' dtype in a written config.json (transformers writes the dtype of
    the model's parameters, which were fp32)."""
    if not config_json.is_file():
        return
    config = json.loads(config_json.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = name
    config.setdefault("dtype", name)
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_base_model(model, tokenizer, out: Path) -> Path:
    """Keep a model built in memory (no checkpoint anywhere) as a model folder at `out`."""
    return save_pretrained_atomic(model, tokenizer, out)


# Tensors of one safetensors file of a written base: the most host memory writing it takes.
BASE_SHARD_BYTES = 2 * 2**30


def write_random_base(spec, files, out: Path, *, device, tokenizer=None, generation_config=None,
                      shard_bytes: int = BASE_SHARD_BYTES) -> Path:
    """Write the random-init base `spec` (a `components.model_init.RandomInit`) to `out` as a model
    folder transformers loads: safetensors files, config.json, the generation config and `files`'
    (the tokenizer's or processor's). The weights are made again on `device`, one module at a time,
    exactly as training made them (same seeds, same device type), so no process ever holds the whole
    model; a 4-bit base is written in its compute dtype, which quantizes to the words training used.
    Written into a staging folder and moved into place whole. `tokenizer`: the one whose special
    tokens the config takes (default: `files`)."""
    import torch
    from safetensors.torch import save_file

    from recipeforge.components.model_init import RandomWeights, build_skeleton, forked_rng, marked_modules

    skeleton, _ = build_skeleton(spec.config, dtype=spec.dtype, attn_implementation=spec.attn_implementation,
                                 num_labels=spec.num_labels)
    device = torch.device(device)
    weights = RandomWeights(skeleton, spec, device=device)
    owners: dict[int, tuple] = {}  # a tied parameter is made by its first holder, as in training
    for _, module in marked_modules(skeleton):
        for name, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), (module, name))
    entries = _state_entries(skeleton)
    shards = _plan_shards(entries, shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
             for i in range(len(shards))]
    with staged_folder(out) as tmp, forked_rng(device), torch.no_grad():
        made: tuple[int, dict] = (0, {})
        weight_map = {}
        for shard, name in zip(shards, names):
            tensors = {}
            for key, tensor in shard:
                if id(tensor) in owners:  # a parameter: made with the rest of its module
                    module, pname = owners[id(tensor)]
                    if made[0] != id(module):
                        made = (id(module), weights.module_tensors(module))
                    tensors[key] = made[1].pop(pname).to("cpu").contiguous()
                else:  # a persistent buffer, computed when the skeleton was built
                    tensors[key] = tensor.detach().to("cpu").contiguous()
                weight_map[key] = name
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            del tensors
        if len(shards) > 1:
            total = sum(_nbytes(t) for shard in shards for _, t in shard)
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        config = skeleton.config
        config.architectures = [type(skeleton).__name__]
        tok = tokenizer if tokenizer is not None else getattr(files, "tokenizer", files)
        if tok is not None:
            config.pad_token_id = tok.pad_token_id
        config.save_pretrained(str(tmp))
        if generation_config is not None:
            generation_config.save_pretrained(str(tmp))
        if files is not None:
            files.save_pretrained(str(tmp))
    return out


def _state_entries(model) -> list[tuple[str, object]]:
    """(key, tensor) of what a saved model holds: parameters and persistent buffers, a tied parameter
    once (under its first name; transformers ties the others again when it loads)."""
    seen: set[int] = set()
    entries = []
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        entries.append((key, tensor))
    return entries


def _plan_shards(entries: list, shard_bytes: int) -> list[list]:
    """`entries` cut, in order, into files of at most `shard_bytes` (a larger tensor alone in its file)."""
    shards: list[list] = [[]]
    size = 0
    for key, tensor in entries:
        n = _nbytes(tensor)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((key, tensor))
        size += n
    return shards


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()
