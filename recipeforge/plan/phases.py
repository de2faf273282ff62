"""The whole run's peaks: memory per phase (load, train step, evaluation, save, merge), per process
and per node, on the GPU and in host RAM, from the chosen layout's train-step estimate.

The train step is `plan.memory`'s estimate. The other phases keep what persists through the run
(weights, gradients where they are kept, optimizer states, adapter, reference model, runtime: the
`PERSISTENT` terms) and add their own:

- load: the weights as they arrive (a quantized base loaded whole where it is, `quantized_load`); the
  host holds one checkpoint tensor in flight, or the whole model on rank 0 where FSDP loads it there
  and broadcasts it (`cpu_ram_efficient_loading`);
- eval: a forward without gradients: the logits of a micro batch and no saved activations;
- save: final/ in its dtype (the compute dtype's 16 bits, or fp32; only the adapter with one):
  safetensors serialises each file (up to 50 GB) in host memory, and a sharded model (FSDP, ZeRO-3)
  is gathered whole into rank 0's host RAM first;
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

from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.memory import PERSISTENT

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.workload import Workload

PROCESS_HOST_BYTES = 1.5 * GIB   # a training process's resident memory before its model (see above)
HOST_BAND = 0.25                 # stated accuracy of the host figures (the process's own size varies by build)
SHARD_BYTES = 50e9               # transformers' save_pretrained max_shard_size ("50GB"): one file serialised at a time
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

    def row(phase: str, device: float, host: float, note: str, first_only: float = 0.0) -> PhasePeak:
        """`device` and `host`: every process's; `first_only`: what rank 0 holds besides (host)."""
        if cpu:  # one process on the CPU: its estimate is host memory
            return PhasePeak(phase, 0.0, host + device + first_only, 0.0, host + device + first_only, note)
        return PhasePeak(phase, device, host + first_only, device * procs, host * procs + first_only, note)

    loaded = part["weights"] + part["adapter"] + part["reference_model"] + part["teacher_model"] + part["runtime"]
    rank0_load = psi * c if sharded and layout.spec.rank0_loads_whole(w, layout) else 0.0
    rows = [row("load", max(loaded, loaded - part["weights"] + part["quantized_load"]), base_host,
                "the weights as they load" + ("; rank 0 reads the whole model to broadcast it" if rank0_load else ""),
                rank0_load),
            row("train", mem.total, base_host, f"the train step's peak ({mem.train_peak or 'see memory'})")]
    if _has_eval(recipe):
        rows.append(row("eval", persistent + part["logits"], base_host,
                        "forward without gradients: the logits of a micro batch"))
    save = saved_bytes(w)
    gathered = save if sharded and w.full_finetune else 0.0
    rows.append(row("save", persistent, base_host,
                    ("the full state dict gathered into rank 0's host RAM, then serialised" if gathered
                     else "final/ serialised in host memory on rank 0"), gathered + min(save, SHARD_BYTES)))
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
                     "RAM (hardware.cpu_ram_gb); a final save written shard by shard is not available yet",
             "merge": "set output.merge_adapter: false and merge later with `recipeforge export` on a larger "
                      "host, or plan for a node with more RAM (hardware.cpu_ram_gb)",
             "load": "plan for a node with more RAM (hardware.cpu_ram_gb)",
             "eval": "lower data.sequence_len or the micro batch"}
    raise RecipeError(f"the {worst.phase} phase needs {worst.host_per_node / GIB:.1f} GB of host RAM per node "
                      f"({worst.note}), and {usable / GIB:.1f} GB is usable ({headroom:.0%} of {ram:.0f} GB, "
                      f"{where})", key="hardware.cpu_ram_gb",
                      hint=fixes[worst.phase])
