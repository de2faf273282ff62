"""What a distributed backend can run, and the presets it names: the records every reader asks.

A `BackendCapabilities` lists the stages, devices, adapters, QLoRA base precisions and offload modes
a backend runs, how many CPU processes it can use, and its backend-specific limits (ZeRO stages,
which stages can offload, which optimizers an offloaded step takes). `refusals` compares a run's
facts with a record and says, with a key and a one-line message, what the backend cannot do. A
`Preset` is a named set of a backend's settings (``zero3_offload``, ``fsdp_full_shard``, ...).

Each backend spec (built-ins in `recipeforge.backends`, plugins through the ``recipeforge.backends``
entry points) declares its record as its ``capabilities`` attribute and its presets through
``preset(name)``; this module finds them through the ``backends`` registry (`backend_specs`), so a
plugin backend is read exactly as a built-in. Every reader asks here instead of keeping its own
list: the recipe rules (`config.schema.rules`, with whatever is known before planning), the planner
(only layouts a backend can run become candidates), each backend's `check()` before launch, and the
support table in docs/backends.md (`support_table_markdown`). It sits at the bottom of the package
(it imports only `errors` and `registry`) so the recipe layer can read it without importing a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from recipeforge.errors import RecipeError
from recipeforge.stage_specs import STAGES, Names




class Device(Names):
    """Where a run trains."""

    CUDA = "cuda"
    CPU = "cpu"


class Adapter(Names):
    """`adapter.type`: full fine-tuning, LoRA, or LoRA on a quantized base."""

    NONE = "none"
    LORA = "lora"
    QLORA = "qlora"


class Offload(Names):
    """`distributed.offload`: what lives in CPU memory instead of on the GPU."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_AND_PARAMS = "optimizer+params"


class Launcher(Names):
    """`distributed.launcher`: who starts the worker processes."""

    AUTO = "auto"   # the backend's own launcher (accelerate launch / torchrun) on this machine, or in place
    RAY = "ray"     # Ray Train's TorchTrainer, one Ray worker per planned process, on an existing Ray cluster


DEVICES = tuple(d.value for d in Device)
ADAPTERS = tuple(a.value for a in Adapter)
OFFLOAD_MODES = tuple(o.value for o in Offload)
LAUNCHERS = tuple(launcher.value for launcher in Launcher)


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
    distribution: str | None = None                   # its pip distribution, when `package` is a namespace
    extra: str | None = None                          # the recipeforge extra that installs it
    why: Mapping[str, str] = field(default_factory=dict)

    def runs_stage(self, stage: str) -> bool:
        """Whether the backend runs `stage`: one it lists, or a plugin's stage when it runs every built-in
        one (a plugin stage's runner is a trainer stage like theirs; a backend with a loop of its own
        lists the stages it runs)."""
        return stage in self.stages or (stage not in STAGES and set(STAGES) <= set(self.stages))


class BackendName(Names):
    """The built-in backends' names, named once (a plugin backend brings its own name)."""

    SINGLE = "single"
    DDP = "ddp"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    MEGATRON = "megatron"


@dataclass(frozen=True)
class Preset:
    """The settings a named preset stands for (its backend's spec declares it)."""

    name: str
    backend: str
    zero_stage: int | None = None
    offload: str = "none"        # none | optimizer | optimizer+params
    sharding: str | None = None  # FSDP: full_shard | shard_grad_op | hybrid_shard
    tensor_parallel: int = 1
    pipeline_parallel: int = 1


@dataclass(frozen=True)
class Refusal:
    """Why a backend cannot run something: the recipe key to change, a one-line message, a hint."""

    key: str
    message: str
    hint: str = ""

    def error(self) -> RecipeError:
        """This refusal as the user error the CLI prints (exit 2)."""
        return RecipeError(self.message, key=self.key, hint=self.hint or None)


def backend_specs(*, builtin_only: bool = False) -> dict:
    """Every backend that loads, by name: the built-ins in their order, then installed plugins (a
    plugin that fails to load is left out here; `recipeforge plugins` reports why). `builtin_only`:
    recipeforge's own backends, whatever plugins are installed."""
    from recipeforge.registry import registry_for

    registry = registry_for("backends")
    out = {}
    for name in registry.builtin_names() if builtin_only else registry.names():
        try:
            out[name] = registry.get(name)
        except RecipeError:
            continue
    return out


def all_capabilities(*, builtin_only: bool = False) -> dict[str, BackendCapabilities]:
    """The capability record of every backend that loads (`backend_specs`), by name."""
    return {name: spec.capabilities for name, spec in backend_specs(builtin_only=builtin_only).items()
            if isinstance(getattr(spec, "capabilities", None), BackendCapabilities)}


def capabilities_of(name: str) -> BackendCapabilities:
    """The record of backend `name`: the ``capabilities`` of its spec (built in or from a plugin)."""
    from recipeforge.registry import registry_for

    return spec_capabilities(name, registry_for("backends").get(name, key="distributed.backend"))


def spec_capabilities(name: str, spec: object) -> BackendCapabilities:
    """The ``capabilities`` record of backend `name`'s spec `spec`; a spec without one is an error."""
    caps = getattr(spec, "capabilities", None)
    if not isinstance(caps, BackendCapabilities):
        raise RecipeError(f"backend '{name}' declares no capabilities", key="distributed.backend",
                          hint="a backend class sets `capabilities = BackendCapabilities(...)` "
                               "(recipeforge.capabilities)")
    return caps


def find_preset(name: str, backend: str | None = None) -> "Preset | None":
    """The preset called `name` among the presets of `backend` (None or ``auto``: of every backend),
    or None. Each backend spec names its presets (`preset`)."""
    specs = backend_specs()
    if backend not in (None, "auto"):
        specs = {backend: specs[backend]} if backend in specs else {}
    for spec in specs.values():
        found = spec.preset(name)
        if found is not None:
            return found
    return None


def preset_names(backend: str | None = None) -> list[str]:
    """Preset names of `backend` (None or ``auto``: of every backend), generated ones as patterns."""
    return [n for name, spec in backend_specs().items() if backend in (None, "auto", name)
            for n in spec.preset_names()]


def _supporting(records: Mapping[str, BackendCapabilities], test) -> list[str]:
    return [n for n, caps in records.items() if test(caps)]


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
    asked = _Asked(caps, all_capabilities(), stage=stage, device=device, adapter=adapter, quant_bits=quant_bits,
                   offload=offload, zero_stage=zero_stage, optimizer=optimizer, cpu_processes=cpu_processes,
                   model_parallel=model_parallel)
    out: list[Refusal] = []
    for check in _CHECKS:  # in this order: the first refusal is the one a backend's check() raises
        out.extend(check(asked))
    return out


@dataclass(frozen=True)
class _Asked:
    """One `refusals` question: the record asked, every record (to name the backends that can), and
    the facts (None, or ``auto`` where a fact allows it: not known yet)."""

    caps: BackendCapabilities
    every: Mapping[str, BackendCapabilities]
    stage: str | None = None
    device: str | None = None
    adapter: str | None = None
    quant_bits: int | None = None
    offload: str | None = None
    zero_stage: int | str | None = None
    optimizer: str | None = None
    cpu_processes: int | None = None
    model_parallel: str | None = None

    def others(self, test) -> str:
        """The hint that names the other backends passing `test`, or auto when none does."""
        names = [b for b in _supporting(self.every, test) if b != self.caps.name]
        return f"use backend: {_either(names)} (or auto)" if names else "set distributed.backend: auto"

    def zero_stage_known(self) -> bool:
        """Whether a ZeRO stage is pinned (neither unknown nor ``auto``)."""
        return self.zero_stage not in (None, "auto")


def _stage_refusals(q: _Asked) -> list[Refusal]:
    """A stage the backend does not run."""
    caps, n, why, stage = q.caps, q.caps.name, q.caps.why, q.stage
    if stage is None or caps.runs_stage(stage):
        return []
    return [Refusal("distributed.backend", f"the {n} backend runs {_both(list(caps.stages))} only, not {stage}"
                    + (f": {why['stages']}" if "stages" in why else ""), q.others(lambda c: c.runs_stage(stage)))]


def _device_refusals(q: _Asked) -> list[Refusal]:
    """A device the backend does not run on, or more CPU processes than it runs."""
    caps, n, why, device, cpu_processes = q.caps, q.caps.name, q.caps.why, q.device, q.cpu_processes
    if device is not None and device not in caps.devices:
        where = "CUDA GPUs" if device == "cpu" else "the CPU"
        return [Refusal("distributed.backend", f"the {n} backend needs {where}"
                        + (f": {why['devices']}" if "devices" in why else ""),
                        ("on the CPU " if device == "cpu" else "on GPUs ") + q.others(lambda c: device in c.devices))]
    if device == "cpu" and cpu_processes is not None and caps.max_cpu_processes is not None \
            and cpu_processes > caps.max_cpu_processes:
        runs = "one process" if caps.max_cpu_processes == 1 else f"at most {caps.max_cpu_processes} processes"
        return [Refusal("distributed.backend", f"backend {n} runs {runs} on the CPU; {cpu_processes} "
                        "processes were asked for",
                        q.others(lambda c: "cpu" in c.devices and (c.max_cpu_processes is None
                                                                    or c.max_cpu_processes >= cpu_processes))
                        + ", or drop --nproc-per-node")]
    return []


def _adapter_refusals(q: _Asked) -> list[Refusal]:
    """An adapter type the backend does not train, or a QLoRA base precision it does not load."""
    caps, n, why, adapter, quant_bits = q.caps, q.caps.name, q.caps.why, q.adapter, q.quant_bits
    if adapter is not None and adapter not in caps.adapters:
        label = {"none": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[adapter]
        fits = [a for a in caps.adapters if a != "none"]
        return [Refusal("adapter.type", f"{label} is not supported on the {n} backend"
                        + (f": {why['adapters']}" if "adapters" in why else ""),
                        (f"use adapter.type: {_either(fits)}, or " if fits else "")
                        + q.others(lambda c: adapter in c.adapters))]
    if adapter == "qlora" and quant_bits is not None and quant_bits not in caps.quantization_bits:
        return [Refusal("adapter.quant.bits", f"the {n} backend runs QLoRA on "
                        f"{_either([str(b) for b in caps.quantization_bits])}-bit "
                        f"bases, not {quant_bits}-bit" + (f": {why['quant_bits']}" if "quant_bits" in why else ""),
                        f"set adapter.quant.bits: {caps.quantization_bits[0]}")]
    return []


def _parallel_refusals(q: _Asked) -> list[Refusal]:
    """A parallel size above 1 the backend does not run (at all, or on the CPU)."""
    caps, n, why, model_parallel = q.caps, q.caps.name, q.caps.why, q.model_parallel
    if model_parallel and model_parallel not in caps.parallel_sizes:
        names = _either(_supporting(q.every, lambda c: model_parallel in c.parallel_sizes))
        return [Refusal(f"distributed.{model_parallel}", f"{model_parallel} > 1 needs the {names} backend "
                        f"(backend is {n})", q.others(lambda c: model_parallel in c.parallel_sizes)
                        + ", or set it to 1 or auto")]
    if model_parallel and q.device == "cpu" and caps.cpu_parallel_sizes is not None \
            and model_parallel not in caps.cpu_parallel_sizes:
        return [Refusal(f"distributed.{model_parallel}", f"the {n} backend runs no {model_parallel} > 1 on the CPU"
                        + (f": {why['cpu_parallel']}" if "cpu_parallel" in why else ""),
                        "set it to 1 or auto on the CPU")]
    return []


def _zero_stage_refusals(q: _Asked) -> list[Refusal]:
    """A pinned ZeRO stage the backend does not have (or any, on a backend that is not ZeRO)."""
    caps, n, zero_stage = q.caps, q.caps.name, q.zero_stage
    if not q.zero_stage_known() or zero_stage in caps.zero_stages:
        return []
    return [Refusal("distributed.zero_stage", f"zero_stage applies to DeepSpeed, not to the {n} backend"
                    if not caps.zero_stages else f"the {n} backend has no ZeRO stage {zero_stage}",
                    "set distributed.backend: deepspeed, or remove zero_stage")]


def _offload_refusals(q: _Asked) -> list[Refusal]:
    """A pinned offload mode the backend cannot run, and an optimizer its offloaded step cannot take."""
    caps, n, why, offload, optimizer = q.caps, q.caps.name, q.caps.why, q.offload, q.optimizer
    if offload in (None, "auto"):
        return []
    out = _offload_mode_refusals(q)
    if offload != "none" and offload in caps.offload and caps.offload_optimizers is not None \
            and optimizer is not None and optimizer not in caps.offload_optimizers:
        out.append(Refusal("train.optimizer", f"train.optimizer {optimizer} cannot be offloaded by the {n} backend: "
                           f"{why['offload_optimizer']}",
                           f"use optimizer: {caps.offload_optimizers[0]} with offload, or offload: none"))
    return out


def _offload_mode_refusals(q: _Asked) -> list[Refusal]:
    """An offload mode the backend lacks, lacks on the CPU, or lacks with the ZeRO stage or QLoRA asked."""
    caps, n, why, offload = q.caps, q.caps.name, q.caps.why, q.offload
    if offload not in caps.offload:
        can = [o for o in caps.offload if o != "none"]
        what = (f"has no offload mode {offload} (it offloads {_either(can)})" if can
                else "cannot offload to CPU memory")
        return [Refusal("distributed.offload", f"the {n} backend {what}"
                        + (f": {why['offload']}" if "offload" in why else ""),
                        (f"use offload: {_either(can)}, or " if can else "")
                        + q.others(lambda c: offload in c.offload))]
    if q.device == "cpu" and caps.cpu_offload is not None and offload not in caps.cpu_offload:
        return [Refusal("distributed.offload", f"the {n} backend cannot offload {offload} on the CPU"
                        + (f": {why['cpu_offload']}" if "cpu_offload" in why else ""),
                        "set offload: none on the CPU")]
    if offload != "none" and caps.offload_zero_stages:
        return _offload_zero_refusals(q)
    return []


def _offload_zero_refusals(q: _Asked) -> list[Refusal]:
    """An offload mode whose ZeRO stages exclude the pinned one, or cannot keep the QLoRA base whole."""
    caps, why, offload, zero_stage, quant_bits = q.caps, q.caps.why, q.offload, q.zero_stage, q.quant_bits
    stages = caps.offload_zero_stages.get(offload, ())
    if q.zero_stage_known() and zero_stage not in stages:
        return [Refusal("distributed.offload", f"offload {offload} needs ZeRO stage "
                        f"{_either([str(s) for s in stages])} (got {zero_stage}): {why['offload_zero']}",
                        f"set zero_stage: {stages[0]}, or another offload")]
    if q.adapter == "qlora" and caps.qlora_zero_stages and not set(stages) & set(caps.qlora_zero_stages) \
            and quant_bits is not None and quant_bits not in caps.sharded_quant_bits:
        return [Refusal("distributed.offload", f"offload {offload} needs ZeRO stage "
                        f"{_either([str(s) for s in stages])}, and {why['qlora_zero']}",
                        f"set adapter.quant.bits: {caps.sharded_quant_bits[0]}, or offload: optimizer")]
    return []


def _qlora_zero_refusals(q: _Asked) -> list[Refusal]:
    """A pinned ZeRO stage that would split a QLoRA base whose precision does not shard."""
    caps, zero_stage, quant_bits = q.caps, q.zero_stage, q.quant_bits
    if q.adapter == "qlora" and q.zero_stage_known() and caps.qlora_zero_stages \
            and zero_stage not in caps.qlora_zero_stages and quant_bits is not None \
            and quant_bits not in caps.sharded_quant_bits:
        return [Refusal("adapter.quant.bits", f"{caps.why['qlora_zero']} (zero_stage {zero_stage}, "
                        f"{quant_bits}-bit base)",
                        f"set adapter.quant.bits: {caps.sharded_quant_bits[0]}, or zero_stage: "
                        f"{caps.qlora_zero_stages[-1]}")]
    return []


_CHECKS = (_stage_refusals, _device_refusals, _adapter_refusals, _parallel_refusals, _zero_stage_refusals,
           _offload_refusals, _qlora_zero_refusals)


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
    zero_stage = getattr(plan.backend_part, "zero_stage", None)  # a ZeRO engine's part of the plan
    found = layout_refusals(caps, recipe, device=plan.device, zero_stage=zero_stage, offload=plan.offload,
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
    """The support table of docs/backends.md, generated from the records (default: recipeforge's own
    backends; the table documents recipeforge, not the plugins installed where it is generated)."""
    records = records if records is not None else all_capabilities(builtin_only=True)
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

    # Run as a script this file is `__main__`, whose BackendCapabilities is not the class the backends'
    # records are instances of; the package's own module reads them.
    from recipeforge import capabilities as package_module

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/backends.md")
    target.write_text(package_module.with_support_table(target.read_text()))
