"""The whole run's peaks: memory per phase (load, train step, evaluation, save, merge), per process
and per node, on the GPU and in host RAM, from the chosen layout's train-step estimate.

The train step is `plan.memory`'s estimate. The other phases keep what persists through the run
(weights, gradients where they are kept, optimizer states, adapter, reference model, runtime: the
`PERSISTENT` terms) and add their own:

- load: the weights as they arrive (a quantized base loaded whole where it is, `quantized_load`); the
  host holds one checkpoint tensor in flight, or the whole model on rank 0 where FSDP loads it there
  and broadcasts it (`cpu_ram_efficient_loading`);
- eval: a forward without gradients: the logits of a micro batch and no saved activations;
- save: final/ in its dtype (the compute dtype's 16 bits, or fp32; only the adapter with one), one of
  three ways (the row's note says which):
  * serialised: a model held whole by one process is written by `save_pretrained`, which builds each
    safetensors file (up to `output.max_shard_size`) in host memory: rank 0 adds one file;
  * streamed: a sharded full fine-tune on a backend that writes final/ tensor by tensor
    (`PlannerSpec.streams_final_save`: FSDP2, ZeRO-3; `outputs.streamed_save`) gathers one tensor at a
    time and appends it to its file: rank 0 adds the largest tensor;
  * gathered: a sharded model saved from its full state dict (an MoE model, whose checkpoint layout
    combines tensors) is gathered whole into rank 0's host RAM, then serialised a file at a time;
- merge (`output.merge_adapter`): the base loaded whole on the host in `model.dtype` beside the trained
  run, merged, and serialised (twice the base's bytes on rank 0).

Host figures include what a training process holds before any model (`PROCESS_HOST_BYTES`: the
interpreter, torch, transformers, the tokenizer and data; measured as the resident peak of the tiny
CPU runs' load phase, `tests/integration/test_phase_memory.py`). On the CPU the train-step estimate is
host memory too. The run's host check uses the largest phase per node, and names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recipeforge.config.schema.output import size_bytes
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.memory import PERSISTENT

if TYPE_CHECKING:
    from recipeforge.plan.memory import Layout
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.workload import Workload

PROCESS_HOST_BYTES = 1.5 * GIB   # a training process's resident memory before its model (see above)
HOST_BAND = 0.25                 # stated accuracy of the host figures (the process's own size varies by build)
SHARD_BYTES = 50e9               # transformers' save_pretrained max_shard_size ("50GB"), merged/'s files
PHASES = ("load", "train", "eval", "save", "merge")


@dataclass(frozen=True)
class PhasePeak:
    """One phase's peak: GPU and host bytes per process (the first rank's where it differs) and per node."""

    phase: str
    gpu_per_process: float
    host_per_process: float
    gpu_per_node: float
    host_per_node: float
    note: str
    fix: str = ""    # what makes this phase fit when it does not (the phase's general fix when empty)

    def as_dict(self) -> dict[str, Any]:
        """plan.json's row (GiB, rounded)."""
        return {"phase": self.phase, "gpu_per_process_gb": round(self.gpu_per_process / GIB, 2),
                "host_per_process_gb": round(self.host_per_process / GIB, 2),
                "gpu_per_node_gb": round(self.gpu_per_node / GIB, 2),
                "host_per_node_gb": round(self.host_per_node / GIB, 2), "note": self.note}


def saved_bytes(w: Workload) -> float:
    """final/'s weights: the adapter (fp32, as peft keeps it), or the full model in 16 bits when the
    run computes in 16 bits, else fp32 (`stages.precision.final_weights_dtype`)."""
    if not w.full_finetune:
        return w.lora_params() * 4.0
    return w.model.total_params() * float(w.compute_bytes)


def largest_tensor_bytes(w: Workload) -> float:
    """The largest single tensor of final/'s full weights: the embeddings, the output layer or a
    decoder layer's largest projection (an MoE layer's fused experts count as one tensor)."""
    m = w.model
    linears = [lin.params for lin in m.layer_linears()]
    return max([m.embedding_params(), m.head_params(), *linears]) * float(w.compute_bytes)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GB" if n >= GIB / 10 else f"{n / 2**20:.1f} MB"


def save_row(recipe: Recipe, w: Workload, layout: Layout, spread: bool) -> tuple[str, float, str, float]:
    """How final/ is written (see the module's docstring): the note, what rank 0 holds besides its
    process, the fix when that does not fit, and what each process's device holds besides its
    persistent terms (a sharded model is gathered one tensor at a time on the device, whole). `spread`:
    the weights are sharded over more than one process."""
    save = saved_bytes(w)
    file_bytes = float(size_bytes(recipe.output.max_shard_size))
    serialised = min(save, file_bytes)
    more_ram = "plan for a node with more RAM (hardware.cpu_ram_gb)"
    lora = "set adapter.type: lora (final/ is then the adapter alone)"
    if not w.full_finetune:  # peft writes the adapter as one file
        return "serialised: final/ (the adapter) serialised in rank 0's host memory", save, more_ram, 0.0
    largest = largest_tensor_bytes(w)
    # A backend that writes its sharded weights tensor by tensor does so with one process too
    if layout.spec.shards_weights(layout) and layout.spec.streams_final_save(w, layout):
        return (f"streamed: final/ written tensor by tensor, each gathered from the shards and appended to its file "
                f"by rank 0 (one tensor in flight, the largest {_size(largest)}); never gathered whole",
                largest, f"{lora}, or {more_ram}", largest if spread else 0.0)
    if spread:
        return ("gathered: the full state dict gathered into rank 0's host RAM, then serialised a file at a time",
                save + serialised, f"set output.max_shard_size smaller (5GB, 1GB): one file is serialised beside "
                f"the gathered state dict; {lora}; or {more_ram}", largest)
    return (f"serialised: final/ written by save_pretrained, one file of up to {_size(serialised)} at a time in "
            f"rank 0's host memory (output.max_shard_size {recipe.output.max_shard_size})", serialised,
            f"set output.max_shard_size smaller (5GB, 1GB): each file is serialised whole in host memory; "
            f"or {more_ram}", 0.0)


def phase_peaks(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation) -> list[PhasePeak]:
    """Each phase the run goes through, in order (eval only with evaluation data, merge only with
    `output.merge_adapter` and an adapter)."""
    layout, mem = ev.layout, ev.memory
    part = mem.components
    cpu = hw.device != "cuda"
    procs = 1 if cpu else max(1, layout.gpus_per_node)
    persistent = sum(part[k] for k in PERSISTENT)
    offloaded = mem.cpu_per_node / procs if not cpu else 0.0
    base_host = PROCESS_HOST_BYTES + offloaded
    # Shards spread over more than one process: a single process holds its whole weights already, so
    # its save and load gather nothing
    sharded = bool(layout.spec.shards_weights(layout)) and not cpu and layout.data_parallel > 1
    psi, c = w.model.total_params(), float(w.compute_bytes)

    def row(phase: str, device: float, host: float, note: str, first_only: float = 0.0, fix: str = "") -> PhasePeak:
        """`device` and `host`: every process's; `first_only`: what rank 0 holds besides (host)."""
        if cpu:  # one process on the CPU: its estimate is host memory
            return PhasePeak(phase, 0.0, host + device + first_only, 0.0, host + device + first_only, note, fix)
        return PhasePeak(phase, device, host + first_only, device * procs, host * procs + first_only, note, fix)

    loaded = part["weights"] + part["adapter"] + part["reference_model"] + part["teacher_model"] + part["runtime"]
    rank0_load = psi * c if sharded and layout.spec.rank0_loads_whole(w, layout) else 0.0
    rows = [row("load", max(loaded, loaded - part["weights"] + part["quantized_load"]), base_host,
                "the weights as they load" + ("; rank 0 reads the whole model to broadcast it" if rank0_load else ""),
                rank0_load),
            row("train", mem.total, base_host, f"the train step's peak ({mem.train_peak or 'see memory'})")]
    if _has_eval(recipe):
        rows.append(row("eval", persistent + part["logits"], base_host,
                        "forward without gradients: the logits of a micro batch"))
    # How final/ is written depends on the processes the weights are spread over, on the CPU too
    spread = bool(layout.spec.shards_weights(layout)) and layout.data_parallel > 1
    note, first, fix, in_flight = save_row(recipe, w, layout, spread)
    rows.append(row("save", persistent + (0.0 if cpu else in_flight), base_host, note, first, fix))
    if recipe.output.merge_adapter and not w.full_finetune:
        rows.append(row("merge", persistent, base_host,
                        f"the base loaded whole on the host in {w.dtype}, merged and serialised",
                        psi * c + min(psi * c, SHARD_BYTES)))
    return rows


def _has_eval(recipe: Recipe) -> bool:
    return bool(recipe.data.val_size) or bool(recipe.data.eval_datasets)


def largest_host_phase(peaks: list[PhasePeak]) -> PhasePeak:
    """The phase with the most host memory per node."""
    return max(peaks, key=lambda p: p.host_per_node)


def check_host_phases(peaks: list[PhasePeak], hw: Hardware, headroom: float) -> str | None:
    """Refuse a run whose largest phase does not fit the node's host RAM, naming the phase (the train
    step is checked with the layout; load, save and merge come after it here). When the RAM is only
    assumed (a target named without `hardware.cpu_ram_gb`), the shortfall is returned as a warning
    instead: the plan cannot know the node's memory, and the user is told what to check."""
    ram, known = hw.host_ram_gb()
    usable = headroom * ram * GIB
    worst = largest_host_phase(peaks)
    if worst.host_per_node <= usable or worst.phase == "train":
        return None
    if not known:
        return (f"the {worst.phase} phase needs {worst.host_per_node / GIB:.1f} GB of host RAM per node "
                f"({worst.note}), above the {usable / GIB:.1f} GB usable of the {ram:.0f} GB assumed for the target; "
                "set hardware.cpu_ram_gb to the node's RAM to have the plan check it")
    where = "hardware.cpu_ram_gb"
    fixes = {"save": "set adapter.type: lora (final/ is then the adapter alone), or plan for a node with more "
                     "RAM (hardware.cpu_ram_gb)",
             "merge": "set output.merge_adapter: false and merge later with `recipeforge export` on a larger "
                      "host, or plan for a node with more RAM (hardware.cpu_ram_gb)",
             "load": "plan for a node with more RAM (hardware.cpu_ram_gb)",
             "eval": "lower data.sequence_len or the micro batch"}
    raise RecipeError(f"the {worst.phase} phase needs {worst.host_per_node / GIB:.1f} GB of host RAM per node "
                      f"({worst.note}), and {usable / GIB:.1f} GB is usable ({headroom:.0%} of {ram:.0f} GB, "
                      f"{where})", key="hardware.cpu_ram_gb",
                      hint=worst.fix or fixes[worst.phase])
