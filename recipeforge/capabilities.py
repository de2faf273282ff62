"""What each distributed backend can run: one record per backend, the only place that says so.

A `BackendCapabilities` lists the stages, devices, adapters, QLoRA base precisions and offload modes
a backend runs, how many CPU processes it can use, and its backend-specific limits (ZeRO stages,
which stages can offload, which optimizers an offloaded step takes). `refusals` compares a run's
facts with a record and says, with a key and a one-line message, what the backend cannot do.

Every reader asks this module instead of keeping its own list: the recipe rules
(`config.schema.rules`, with whatever is known before planning), the planner (`plan.policy`,
`plan.world`: only layouts a backend can run become candidates), each backend's `check()` before
launch, and the support table in docs/backends.md (`support_table_markdown`). It sits at the bottom
of the package (it imports only `errors` and `registry`) so the recipe layer can read it without
importing a backend.

Built-in records are `BUILTIN`; a plugin backend declares its own as the ``capabilities`` attribute of
the class its ``recipeforge.backends`` entry point names, and `capabilities_of` finds it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from recipeforge.errors import RecipeError

STAGES = ("pretrain", "sft", "dpo", "grpo", "orpo", "kto", "cpo", "reward")
DEVICES = ("cuda", "cpu")
ADAPTERS = ("none", "lora", "qlora")
OFFLOAD_MODES = ("none", "optimizer", "optimizer+params")


@dataclass(frozen=True)
class BackendCapabilities:
    """What one backend runs. Tuples list what is supported; `why` explains each limit (shown in errors
    and docs) by dimension name: ``stages``, ``devices``, ``adapters``, ``offload``, ``cpu_processes``."""

    name: str
    summary: str
    stages: tuple[str, ...] = STAGES
    devices: tuple[str, ...] = DEVICES
    adapters: tuple[str, ...] = ADAPTERS
    quantization_bits: tuple[int, ...] = (4, 8)       # QLoRA base precisions (empty without qlora)
    offload: tuple[str, ...] = ("none",)
    max_cpu_processes: int | None = None              # None: any number of gloo processes
    parallel_sizes: tuple[str, ...] = ()              # distributed.* parallel sizes it runs above 1
    cpu_parallel_sizes: tuple[str, ...] | None = None  # those it runs on the CPU (None: all of them)
    cpu_offload: tuple[str, ...] | None = None        # offload modes it runs on the CPU (None: all of them)
    zero_stages: tuple[int, ...] = ()                 # DeepSpeed ZeRO stages (empty: not ZeRO)
    offload_zero_stages: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # offload -> ZeRO stages
    qlora_zero_stages: tuple[int, ...] = ()           # ZeRO stages that keep quantized weights whole
    sharded_quant_bits: tuple[int, ...] = (4,)        # QLoRA precisions whose weights shard (ZeRO-3, FSDP)
    offload_optimizers: tuple[str, ...] | None = None  # optimizers an offloaded step takes (None: any)
    presets: tuple[str, ...] = ()
    package: str | None = None                        # module it needs (looked up, never imported)
    extra: str | None = None                          # the recipeforge extra that installs it
    why: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """Why a backend cannot run something: the recipe key to change, a one-line message, a hint."""

    key: str
    message: str
    hint: str = ""

    def error(self) -> RecipeError:
        """This refusal as the user error the CLI prints (exit 2)."""
        return RecipeError(self.message, key=self.key, hint=self.hint or None)


_GPU_ONLY = "Megatron-Core's forward is CUDA-only"
BUILTIN: dict[str, BackendCapabilities] = {c.name: c for c in (
    BackendCapabilities(
        "single", "one process: a GPU, or the CPU", max_cpu_processes=1,
        why={"offload": "one process keeps its optimizer where its weights are",
             "cpu_processes": "it runs one process"}),
    BackendCapabilities(
        "ddp", "a full replica per process (torch DDP); NCCL on GPUs, gloo on the CPU",
        why={"offload": "every replica keeps its full optimizer on its device"}),
    BackendCapabilities(
        "deepspeed", "ZeRO data parallelism; gloo on the CPU",
        offload=OFFLOAD_MODES, zero_stages=(0, 1, 2, 3),
        offload_zero_stages={"optimizer": (2, 3), "optimizer+params": (3,)},
        qlora_zero_stages=(0, 1, 2), offload_optimizers=("adamw", "adamw_fused"),
        presets=("zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_offload_params"),
        package="deepspeed", extra="deepspeed",
        why={"qlora_zero": "ZeRO-3 partitions 4-bit QLoRA weights (stored as bf16/fp16 words, "
                           "bnb_4bit_quant_storage) but not 8-bit ones, which are int8 with per-row scales",
             "offload_zero": "ZeRO offloads optimizer states from stage 2 and parameters from stage 3",
             "offload_optimizer": "DeepSpeed steps offloaded optimizer states with its own CPU Adam"}),
    BackendCapabilities(
        "fsdp", "FSDP2 (fully_shard) through Accelerate; NCCL on GPUs, gloo on the CPU",
        quantization_bits=(4,), offload=("none", "optimizer+params"),
        parallel_sizes=("tensor_parallel", "context_parallel", "data_parallel_replicate", "data_parallel_shard"),
        cpu_parallel_sizes=("tensor_parallel",), cpu_offload=("none",),
        presets=("fsdp_shard_grad_op", "fsdp_full_shard", "fsdp_hybrid_shard", "fsdp_full_shard_offload"),
        why={"cpu_offload": "FSDP2 offload moves weights between an accelerator and host memory; on the CPU "
                            "they are in host memory already (the CPUOffloadPolicy of torch needs an accelerator)",
             "cpu_parallel": "on the CPU every process shards the model (tensor parallel inside); context "
                             "parallel (ring attention) needs CUDA, and replica/shard mesh sizes are for GPU nodes",
             "quant_bits": "FSDP shards 4-bit weights stored as bf16/fp16 words (bnb_4bit_quant_storage); "
                           "8-bit weights are int8 with per-row scales and do not shard",
             "offload": "FSDP2's CPU offload moves parameters, gradients and optimizer states together"}),
    BackendCapabilities(
        "megatron", "Megatron-Core tensor / pipeline / data parallelism through Megatron-Bridge",
        stages=("pretrain", "sft"), devices=("cuda",), adapters=("none", "lora"), quantization_bits=(),
        offload=("none", "optimizer"), max_cpu_processes=0,
        parallel_sizes=("tensor_parallel", "pipeline_parallel"),
        offload_optimizers=("adamw", "adamw_fused"), presets=("tp{T}_pp{P}", "tp{T}_pp{P}_offload"),
        package="megatron.bridge", extra="megatron",
        why={"stages": "Megatron-Bridge's training loop has no preference or RL losses",
             "devices": _GPU_ONLY, "adapters": "Megatron-Bridge's LoRA has no 4-bit base",
             "offload": "the distributed optimizer offloads optimizer states only (optimizer_cpu_offload)",
             "offload_optimizer": "Megatron-Core offloads Adam's states to the CPU, not SGD's"}),
)}


def capabilities_of(name: str) -> BackendCapabilities:
    """The record of backend `name`: built in, or the ``capabilities`` of a plugin backend's class."""
    if name in BUILTIN:
        return BUILTIN[name]
    from recipeforge.registry import registry_for

    backend = registry_for("backends").get(name, key="distributed.backend")
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, BackendCapabilities):
        raise RecipeError(f"backend '{name}' declares no capabilities", key="distributed.backend",
                          hint="a backend class sets `capabilities = BackendCapabilities(...)` "
                               "(recipeforge.capabilities)")
    return caps


def preset_facts(name: str) -> tuple[str, int | None, str] | None:
    """(backend, ZeRO stage, offload) a built-in preset name stands for, None for an unknown name
    (`plan.presets` holds the full meaning; a test keeps the two in step)."""
    import re

    owner = next((c.name for c in BUILTIN.values() if name in c.presets), None)
    if owner is None and re.fullmatch(r"tp\d+_pp\d+(_offload)?", name):
        owner = "megatron"
    if owner is None:
        return None
    if owner == "deepspeed":
        offload = "optimizer+params" if name.endswith("_offload_params") else \
            "optimizer" if name.endswith("_offload") else "none"
        return owner, int(name[4]), offload
    offload = {"fsdp": "optimizer+params", "megatron": "optimizer"}[owner] if name.endswith("_offload") else "none"
    return owner, None, offload


def _supporting(names: Iterable[str], test) -> list[str]:
    return [n for n in names if test(BUILTIN[n])]


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _both(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def refusals(caps: BackendCapabilities, *, stage: str | None = None, device: str | None = None,
             adapter: str | None = None, quant_bits: int | None = None, offload: str | None = None,
             zero_stage: int | str | None = None, optimizer: str | None = None,
             cpu_processes: int | None = None, model_parallel: str | None = None) -> list[Refusal]:
    """What `caps` refuses among the given facts (None, or ``auto``, means not known yet: not checked).
    `model_parallel` names a parallel size above 1 (``tensor_parallel``, ``pipeline_parallel``,
    ``context_parallel``, ...), if any.

    `zero_stage`/`offload` may be ``auto``; a pinned offload mode then still needs a ZeRO stage that
    can do it, and QLoRA one that keeps 4-bit weights whole, so such pairs are refused as early as
    the recipe pins them."""
    out: list[Refusal] = []
    n = caps.name
    why = caps.why
    backend_hint = "set distributed.backend: auto"

    def others(test) -> str:
        names = [b for b in _supporting(BUILTIN, test) if b != n]
        return f"use backend: {_either(names)} (or auto)" if names else backend_hint

    if stage is not None and stage not in caps.stages:
        out.append(Refusal("distributed.backend", f"the {n} backend runs {_both(list(caps.stages))} only, not {stage}"
                           + (f": {why['stages']}" if "stages" in why else ""), others(lambda c: stage in c.stages)))
    if device is not None and device not in caps.devices:
        where = "CUDA GPUs" if device == "cpu" else "the CPU"
        out.append(Refusal("distributed.backend", f"the {n} backend needs {where}"
                           + (f": {why['devices']}" if "devices" in why else ""),
                           ("on the CPU " if device == "cpu" else "on GPUs ") + others(lambda c: device in c.devices)))
    elif device == "cpu" and cpu_processes is not None and caps.max_cpu_processes is not None \
            and cpu_processes > caps.max_cpu_processes:
        runs = "one process" if caps.max_cpu_processes == 1 else f"at most {caps.max_cpu_processes} processes"
        out.append(Refusal("distributed.backend", f"backend {n} runs {runs} on the CPU; {cpu_processes} "
                           "processes were asked for",
                           others(lambda c: "cpu" in c.devices and (c.max_cpu_processes is None
                                                                       or c.max_cpu_processes >= cpu_processes)) + ", or drop --nproc-per-node"))
    if adapter is not None and adapter not in caps.adapters:
        label = {"none": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[adapter]
        fits = [a for a in caps.adapters if a != "none"]
        out.append(Refusal("adapter.type", f"{label} is not supported on the {n} backend"
                           + (f": {why['adapters']}" if "adapters" in why else ""),
                           (f"use adapter.type: {_either(fits)}, or " if fits else "")
                           + others(lambda c: adapter in c.adapters)))
    elif adapter == "qlora" and quant_bits is not None and quant_bits not in caps.quantization_bits:
        out.append(Refusal("adapter.quant.bits", f"the {n} backend runs QLoRA on {_either([str(b) for b in caps.quantization_bits])}-bit "
                           f"bases, not {quant_bits}-bit" + (f": {why['quant_bits']}" if "quant_bits" in why else ""),
                           f"set adapter.quant.bits: {caps.quantization_bits[0]}"))
    if model_parallel and model_parallel not in caps.parallel_sizes:
        names = _either(_supporting(BUILTIN, lambda c: model_parallel in c.parallel_sizes))
        out.append(Refusal(f"distributed.{model_parallel}", f"{model_parallel} > 1 needs the {names} backend "
                           f"(backend is {n})", others(lambda c: model_parallel in c.parallel_sizes)
                           + ", or set it to 1 or auto"))
    elif model_parallel and device == "cpu" and caps.cpu_parallel_sizes is not None \
            and model_parallel not in caps.cpu_parallel_sizes:
        out.append(Refusal(f"distributed.{model_parallel}", f"the {n} backend runs no {model_parallel} > 1 on the CPU"
                           + (f": {why['cpu_parallel']}" if "cpu_parallel" in why else ""),
                           "set it to 1 or auto on the CPU"))
    if zero_stage not in (None, "auto") and zero_stage not in caps.zero_stages:
        out.append(Refusal("distributed.zero_stage", f"zero_stage applies to DeepSpeed, not to the {n} backend"
                           if not caps.zero_stages else f"the {n} backend has no ZeRO stage {zero_stage}",
                           "set distributed.backend: deepspeed, or remove zero_stage"))
    if offload not in (None, "auto"):
        if offload not in caps.offload:
            can = [o for o in caps.offload if o != "none"]
            what = (f"has no offload mode {offload} (it offloads {_either(can)})" if can
                    else "cannot offload to CPU memory")
            out.append(Refusal("distributed.offload", f"the {n} backend {what}"
                               + (f": {why['offload']}" if "offload" in why else ""),
                               (f"use offload: {_either(can)}, or " if can else "")
                               + others(lambda c: offload in c.offload)))
        elif device == "cpu" and caps.cpu_offload is not None and offload not in caps.cpu_offload:
            out.append(Refusal("distributed.offload", f"the {n} backend cannot offload {offload} on the CPU"
                               + (f": {why['cpu_offload']}" if "cpu_offload" in why else ""),
                               "set offload: none on the CPU"))
        elif offload != "none" and caps.offload_zero_stages:
            stages = caps.offload_zero_stages.get(offload, ())
            if zero_stage not in (None, "auto") and zero_stage not in stages:
                out.append(Refusal("distributed.offload", f"offload {offload} needs ZeRO stage "
                                   f"{_either([str(s) for s in stages])} (got {zero_stage}): {why['offload_zero']}",
                                   f"set zero_stage: {stages[0]}, or another offload"))
            elif adapter == "qlora" and caps.qlora_zero_stages and not set(stages) & set(caps.qlora_zero_stages) \
                    and quant_bits is not None and quant_bits not in caps.sharded_quant_bits:
                out.append(Refusal("distributed.offload", f"offload {offload} needs ZeRO stage "
                                   f"{_either([str(s) for s in stages])}, and {why['qlora_zero']}",
                                   f"set adapter.quant.bits: {caps.sharded_quant_bits[0]}, or offload: optimizer"))
        if offload != "none" and offload in caps.offload and caps.offload_optimizers is not None \
                and optimizer is not None and optimizer not in caps.offload_optimizers:
            out.append(Refusal("train.optimizer", f"train.optimizer {optimizer} cannot be offloaded by the {n} backend: "
                               f"{why['offload_optimizer']}",
                               f"use optimizer: {caps.offload_optimizers[0]} with offload, or offload: none"))
    if adapter == "qlora" and zero_stage not in (None, "auto") and caps.qlora_zero_stages \
            and zero_stage not in caps.qlora_zero_stages and quant_bits is not None \
            and quant_bits not in caps.sharded_quant_bits:
        out.append(Refusal("adapter.quant.bits", f"{why['qlora_zero']} (zero_stage {zero_stage}, "
                           f"{quant_bits}-bit base)",
                           f"set adapter.quant.bits: {caps.sharded_quant_bits[0]}, or zero_stage: "
                           f"{caps.qlora_zero_stages[-1]}"))
    return out


def parallel_key(tensor_parallel, pipeline_parallel, context_parallel=1) -> str | None:
    """The first parallel size above 1, as its recipe key (None: none is; ``auto`` counts as not above 1).
    Pipeline and context parallel come first: fewer backends run them."""
    for key, value in (("pipeline_parallel", pipeline_parallel), ("context_parallel", context_parallel),
                       ("tensor_parallel", tensor_parallel)):
        if isinstance(value, int) and value > 1:
            return key
    return None


def layout_refusals(caps: BackendCapabilities, recipe, *, device: str, zero_stage, offload: str,
                    cpu_processes: int | None = None, model_parallel: str | None = None) -> list[Refusal]:
    """`refusals` for a concrete layout (a planned or candidate one) of `recipe`."""
    a = recipe.adapter
    return refusals(caps, stage=recipe.stage, device=device, adapter=a.type, quant_bits=a.quant.bits,
                    offload=offload, zero_stage=zero_stage, optimizer=recipe.train.optimizer,
                    cpu_processes=cpu_processes, model_parallel=model_parallel)


def check_plan(caps: BackendCapabilities, plan, recipe) -> None:
    """Raise the first refusal of `caps` for a finished plan (what a backend's `check()` asks)."""
    found = layout_refusals(caps, recipe, device=plan.device, zero_stage=plan.zero_stage, offload=plan.offload,
                            cpu_processes=plan.world_size if plan.device == "cpu" else None,
                            model_parallel=parallel_key(plan.tensor_parallel, plan.pipeline_parallel,
                                                        plan.extra.context_parallel))
    if found:
        raise found[0].error()


# ----------------------------------------------------------------------------- docs

def _cell(values: Iterable, all_values: tuple) -> str:
    values = tuple(values)
    if values == all_values:
        return "all"
    return ", ".join(str(v) for v in values) or "—"


def support_table_markdown(records: Mapping[str, BackendCapabilities] | None = None) -> str:
    """The support table of docs/backends.md, generated from the records."""
    records = records if records is not None else BUILTIN
    rows = ["| backend | stages | devices | adapters | QLoRA bits | offload | CPU processes | presets |",
            "|---|---|---|---|---|---|---|---|"]
    for c in records.values():
        cpu = "—" if "cpu" not in c.devices else ("any" if c.max_cpu_processes is None else str(c.max_cpu_processes))
        presets = ", ".join(f"`{p}`" for p in c.presets) or "—"
        rows.append(f"| `{c.name}` | {_cell(c.stages, STAGES)} | {', '.join(c.devices)} | "
                    f"{_cell(c.adapters, ADAPTERS)} | {_cell(c.quantization_bits, (4, 8))} | "
                    f"{_cell(c.offload, OFFLOAD_MODES)} | {cpu} | {presets} |")
    notes = []
    for c in records.values():
        extra = []
        if c.offload_zero_stages:
            extra.append("offload " + "; ".join(f"{o} from ZeRO {_either([str(s) for s in st])}"
                                                for o, st in c.offload_zero_stages.items()))
        if c.qlora_zero_stages:
            extra.append(f"QLoRA on ZeRO {_either([str(s) for s in c.qlora_zero_stages])}, and on ZeRO-3 with "
                         f"{_either([str(b) for b in c.sharded_quant_bits])}-bit bases")
        if c.offload_optimizers:
            extra.append(f"offload with optimizer {_either(list(c.offload_optimizers))}")
        limits = [v for k, v in c.why.items()]
        notes.append(f"- `{c.name}`: {c.summary}" + (f"; {'; '.join(extra)}" if extra else "")
                     + (f". Limits: {'; '.join(limits)}." if limits else "."))
    return "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


TABLE_START = "<!-- support table: generated by `python -m recipeforge.capabilities docs/backends.md` -->"
TABLE_END = "<!-- end of support table -->"


def with_support_table(doc: str) -> str:
    """`doc` (docs/backends.md) with the text between the table markers replaced by the current table."""
    head, start, rest = doc.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError("the document has no support table markers")
    return f"{head}{TABLE_START}\n{support_table_markdown()}{TABLE_END}{tail}"


if __name__ == "__main__":  # rewrite the generated table of docs/backends.md
    import sys
    from pathlib import Path

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/backends.md")
    target.write_text(with_support_table(target.read_text()))
