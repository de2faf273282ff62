"""Hugging Face <-> Megatron weights through Megatron-Bridge's own API, on one process or on every rank
of a tensor-parallel group.

Both directions are collective: with tensor parallelism N, N processes (gloo on the CPU) each hold a
1/N slice of every split weight and call the same function; Megatron-Bridge gathers and splits them.
With one process a temporary one-rank gloo group is made here, as Megatron-Bridge's own
``import_ckpt`` / ``export_ckpt`` do.

* `hf_to_megatron`: ``AutoBridge.from_hf_pretrained`` -> ``to_megatron_provider(load_weights=True)``
  at the asked tensor-parallel size -> ``provide_distributed_model`` (CPU initialization) ->
  ``save_megatron_model`` (a ``torch_dist`` checkpoint with Megatron-Bridge's ``run_config.yaml``).
  This is ``AutoBridge.import_ckpt`` with the parallel size and the layer spec chosen here.
* `megatron_to_hf`: ``AutoBridge.load_megatron_model`` (any saved parallel size is resharded to the
  group's) -> ``save_hf_pretrained`` (safetensors, written by rank 0).

The layer spec: without CUDA the local one (Megatron-Core's own layers; Transformer Engine's need a
GPU), else Megatron-Bridge's default (Transformer Engine). The two name their norm weights differently,
so a checkpoint converted for one does not load into the other; `layer_spec_name` is part of the
cache key of converted checkpoints (`megatron_convert`).

Megatron is imported inside the functions only.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

LOCAL_SPEC = "local"
TE_SPEC = "transformer_engine"


def layer_spec_name() -> str:
    """The layer spec conversions and models use here: Transformer Engine's on a GPU, else the local one."""
    import torch

    return TE_SPEC if torch.cuda.is_available() else LOCAL_SPEC


@contextmanager
def model_parallel(tensor_parallel: int) -> Iterator[None]:
    """Megatron-Core's parallel state for a conversion at `tensor_parallel`.

    Inside a job (torchrun has set up the process group) the group's size must equal the tensor-parallel
    size: a conversion has no data or pipeline parallelism. Outside one, with `tensor_parallel` 1, a
    one-rank gloo group is made for the block and removed after it."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    made_group = False
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
            dist.init_process_group("gloo")
        elif tensor_parallel == 1:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0)
        else:
            raise RuntimeError(f"a conversion at tensor parallel {tensor_parallel} runs in {tensor_parallel} processes")
        made_group = True
    if dist.get_world_size() != tensor_parallel:
        raise RuntimeError(f"tensor parallel {tensor_parallel} needs exactly {tensor_parallel} processes, "
                           f"not {dist.get_world_size()}")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)
    if torch.cuda.is_available():
        # Transformer Engine's layers draw from Megatron's CUDA RNG tracker when they are built.
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if made_group:
            dist.destroy_process_group()


@contextmanager
def _saving_without_gpu() -> Iterator[None]:
    """Let Megatron-Bridge save a weights-only checkpoint on a machine without a GPU.

    Two calls on the save path need a CUDA driver although nothing of theirs matters without a GPU
    (Megatron-Bridge 0.6.2, megatron-core 0.19.2):

    * ``get_rng_state`` (megatron/bridge/training/checkpointing.py:491) calls ``torch.cuda.get_rng_state()``;
      ``save_megatron_model`` saves with ``save_rng=False`` and ``generate_state_dict`` leaves the states
      out of the checkpoint, so an empty state stands in;
    * the checkpoint writer's ``preload_tensors`` (megatron/core/dist_checkpointing/strategies/
      filesystem_async.py:248) calls ``torch.cuda.synchronize()`` after its copies to host memory; with
      every tensor on the CPU there is no device work to wait for, so it returns at once;
    * ``save_state_dict_async_finalize`` (megatron/core/dist_checkpointing/strategies/state_dict_saver.py:252)
      puts the failure flag it broadcasts on ``torch.cuda.current_device()``; over gloo that tensor lives on
      the CPU, so the CPU is named as the current device.

    Only for the block and only without CUDA; with a GPU nothing changes. Any other CUDA call still fails."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    real = torch.cuda.get_rng_state, torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)
    torch.cuda.synchronize = lambda device=None: None
    setattr(torch.cuda, "current_device", lambda: "cpu")  # a device name where torch declares an index
    try:
        yield
    finally:
        torch.cuda.get_rng_state, torch.cuda.synchronize, torch.cuda.current_device = real


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bridge(source: str, *, trust_remote_code: bool, revision: str | None) -> tuple[Any, dict[str, Any]]:
    from recipeforge.backends.megatron_bridge import auto_bridge

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    return auto_bridge().from_hf_pretrained(source, **kwargs), kwargs


def hf_to_megatron(source: str, dest: Path, *, tensor_parallel: int = 1, trust_remote_code: bool = False,
                   revision: str | None = None) -> None:
    """Write the Hugging Face model `source` (hub id or folder) as a Megatron checkpoint in `dest`.

    Collective: every rank of the group calls it with the same arguments (`model_parallel`)."""
    bridge, kwargs = _bridge(source, trust_remote_code=trust_remote_code, revision=revision)
    provider = bridge.to_megatron_provider(load_weights=True)
    provider.tensor_model_parallel_size = tensor_parallel
    provider.pipeline_model_parallel_size = 1
    if layer_spec_name() == LOCAL_SPEC:
        from megatron.bridge.models.gpt_provider import local_layer_spec

        provider.transformer_layer_spec = local_layer_spec
        # The bridges ask for Apex's persistent layer norm and fused weight-gradient accumulation, which the
        # local spec refuses without Apex's CUDA extensions; kernel choices, not weights.
        provider.persist_layer_norm = False
        provider.gradient_accumulation_fusion = False
    provider.finalize()
    tokenizer_kwargs = dict(getattr(bridge._model_bridge, "get_hf_tokenizer_kwargs", lambda: None)() or {})
    for key in ("revision", "trust_remote_code"):  # as import_ckpt passes them on to the tokenizer
        if kwargs.get(key):
            tokenizer_kwargs.setdefault(key, kwargs[key])
    import torch

    with model_parallel(tensor_parallel), _saving_without_gpu():
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        bridge.save_megatron_model(model, str(dest), hf_tokenizer_path=source, hf_tokenizer_kwargs=tokenizer_kwargs,
                                   low_memory_save=torch.cuda.is_available())


def megatron_to_hf(reference: str, checkpoint: Path, dest: Path, *, tensor_parallel: int = 1,
                   trust_remote_code: bool = False, revision: str | None = None) -> None:
    """Write the Megatron checkpoint `checkpoint` (a folder with ``iter_*`` or one iteration) as Hugging
    Face safetensors in `dest`; `reference` is the Hugging Face model it came from (its config and
    tokenizer files go with the weights). Collective like `hf_to_megatron`; rank 0 writes."""
    bridge, _ = _bridge(reference, trust_remote_code=trust_remote_code, revision=revision)
    with model_parallel(tensor_parallel):
        model = bridge.load_megatron_model(str(checkpoint), mp_overrides={"tensor_model_parallel_size": tensor_parallel})
        bridge.save_hf_pretrained(model, str(dest), show_progress=False)


# ----------------------------------------------------------------------------- several processes

def convert(task: dict[str, Any], *, tensor_parallel: int = 1) -> None:
    """Run one conversion (`task`: ``direction`` ``hf_to_megatron`` or ``megatron_to_hf`` and that
    function's keyword arguments, paths as strings) at `tensor_parallel`: in this process for 1, else
    in that many gloo processes started with torch's launcher (this module's `main` in each)."""
    if tensor_parallel == 1:
        _run(task, tensor_parallel=1)
        return
    import json
    import subprocess
    import tempfile

    from recipeforge.backends.launcher_command import launcher_command

    with tempfile.TemporaryDirectory(prefix="recipeforge-convert-") as tmp:
        spec = Path(tmp) / "task.json"
        spec.write_text(json.dumps(task))
        command = [*launcher_command("torchrun", "torch.distributed.run"), "--standalone",
                   "--nproc_per_node", str(tensor_parallel), "-m", __name__, str(spec)]
        # the processes share this machine's cores instead of each taking all of them
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // tensor_parallel))}
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the conversion at tensor parallel {tensor_parallel} failed "
                           f"(exit {proc.returncode}):\n{(proc.stderr or proc.stdout)[-4000:]}")


def _run(task: dict[str, Any], *, tensor_parallel: int) -> None:
    args = dict(task)
    direction = args.pop("direction")
    paths = {k: Path(v) for k, v in args.items() if k in ("dest", "checkpoint")}
    if direction == "hf_to_megatron":
        hf_to_megatron(**{**args, **paths}, tensor_parallel=tensor_parallel)
    elif direction == "megatron_to_hf":
        megatron_to_hf(**{**args, **paths}, tensor_parallel=tensor_parallel)
    else:
        raise ValueError(f"unknown conversion {direction!r}")


def main(argv: list[str] | None = None) -> int:
    """One rank of a several-process conversion: ``python -m recipeforge.backends.megatron_weights TASK.json``
    under torch's launcher (the group's size is the tensor-parallel size)."""
    import json
    import sys

    argv = sys.argv[1:] if argv is None else argv
    task = json.loads(Path(argv[0]).read_text())
    _run(task, tensor_parallel=int(os.environ.get("WORLD_SIZE", "1")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
