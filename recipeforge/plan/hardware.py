"""The machine a recipe is planned for: known accelerators, `--hardware` specs and the local probe.

GB in the planner means GiB (2**30 bytes), the unit nvidia-smi, torch and DeepSpeed's estimators
report. Accelerator memory below is what the driver reports as total memory, not the marketing figure
(an "80GB" H100 shows 81559 MiB).

Nothing here imports torch: the probe asks NVML (pynvml) or nvidia-smi first and falls back to torch
only when a GPU driver is present but neither of those answered.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from recipeforge.errors import RecipeError, did_you_mean

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe

GIB = 2 ** 30


@dataclass(frozen=True)
class Accelerator:
    """One kind of GPU: memory, precision support and peak dense throughput."""

    name: str                       # canonical name, e.g. "H100-80GB"
    memory_gb: float                # total memory as reported by the driver, GiB
    bf16: bool                      # native bfloat16 (Ampere and later, CDNA2 and later)
    fp8: bool                       # fp8 tensor cores (Hopper, Ada, Blackwell, CDNA3)
    peak_tflops: float              # dense (no sparsity) bf16 TFLOP/s, fp16 where bf16 is absent
    vendor: str = "nvidia"


# Peak figures are the vendors' dense tensor-core numbers (SXM parts where a form factor varies).
ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    Accelerator("B200-180GB", 179.1, True, True, 2250.0),
    Accelerator("H200-141GB", 140.4, True, True, 989.0),
    Accelerator("H100-94GB", 93.0, True, True, 835.0),
    Accelerator("H100-80GB", 79.6, True, True, 989.0),
    Accelerator("A100-80GB", 80.0, True, False, 312.0),
    Accelerator("A100-40GB", 40.0, True, False, 312.0),
    Accelerator("L40S-48GB", 45.0, True, True, 362.0),
    Accelerator("A6000-48GB", 48.0, True, False, 155.0),
    Accelerator("L4-24GB", 22.5, True, True, 121.0),
    Accelerator("A10G-24GB", 22.5, True, False, 70.0),
    Accelerator("RTX4090-24GB", 24.0, True, True, 165.0),
    Accelerator("V100-32GB", 32.0, False, False, 125.0),
    Accelerator("V100-16GB", 16.0, False, False, 125.0),
    Accelerator("T4-16GB", 15.0, False, False, 65.0),
    Accelerator("MI300X-192GB", 192.0, True, True, 1307.0, vendor="amd"),
)}


@dataclass(frozen=True)
class Hardware:
    """Where the run goes: `nodes` machines with `gpus_per_node` accelerators each (0: CPU only)."""

    nodes: int
    gpus_per_node: int
    accelerator: Accelerator | None       # None on CPU-only machines
    cpu_ram_gb: float | None = None       # per node, GiB; None when unknown (a target spec)
    source: str = "probe"                 # "--hardware" | "recipe" | "probe"

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_node > 0 and self.accelerator is not None else "cpu"

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node if self.device == "cuda" else 0

    @property
    def gpu_memory_gb(self) -> float:
        return self.accelerator.memory_gb if self.accelerator else 0.0

    def host_ram_gb(self) -> tuple[float, bool]:
        """Host RAM per node and whether it is known. For a target spec the planner assumes
        max(128 GiB, 2x the node's GPU memory), a common server ratio; the probe reads the real value."""
        if self.cpu_ram_gb is not None:
            return self.cpu_ram_gb, True
        return max(128.0, 2.0 * self.gpus_per_node * self.gpu_memory_gb), False

    def as_section(self) -> dict[str, Any]:
        """This machine as a recipe's `hardware:` section (what `--hardware` puts in place of the recipe's)."""
        section: dict[str, Any] = {"nodes": self.nodes,
                                   "gpus_per_node": self.gpus_per_node if self.device == "cuda" else 0}
        if self.accelerator is not None:
            section["gpu"] = self.accelerator.name
        if self.cpu_ram_gb is not None:
            section["cpu_ram_gb"] = self.cpu_ram_gb
        return section

    def describe(self) -> str:
        """``2x8xH100-80GB``, ``1xL4-24GB`` or ``cpu``: the spec form of this machine."""
        if self.device == "cpu":
            return "cpu"
        assert self.accelerator is not None  # a "cuda" device has one
        prefix = f"{self.nodes}x" if self.nodes > 1 else ""
        return f"{prefix}{self.gpus_per_node}x{self.accelerator.name}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["device"] = self.device
        out["spec"] = self.describe()
        return out


def known_accelerators() -> list[str]:
    """Names accepted in hardware specs."""
    return list(ACCELERATORS)


def lookup_accelerator(name: str, *, key: str = "--hardware") -> Accelerator:
    """The accelerator called `name` (case-insensitive; a bare family such as ``L4`` works when it
    names exactly one entry). Unknown names raise a `RecipeError` listing the known ones."""
    wanted = name.strip().upper().replace("_", "-")
    for acc in ACCELERATORS.values():
        if acc.name.upper() == wanted:
            return acc
    family = [a for a in ACCELERATORS.values() if a.name.upper().split("-")[0] == wanted]
    if len(family) == 1:
        return family[0]
    known = known_accelerators()
    suggestion = did_you_mean(name, known) if not family else f"which one: {', '.join(a.name for a in family)}?"
    hint = f"{suggestion + ' ' if suggestion else ''}known accelerators: {', '.join(known)}"
    raise RecipeError(f"unknown accelerator '{name}'", hint=hint, key=key)


_SPEC = re.compile(r"^(?:(\d+)\s*[xX]\s*)?(?:(\d+)\s*[xX]\s*)?([A-Za-z][\w.\-]*)$")


def parse_hardware(spec: str, *, nnodes: int | None = None) -> Hardware:
    """Parse ``8xH100-80GB``, ``2x8xA100-80GB`` (nodes x GPUs x name), ``L4-24GB`` (one GPU) or ``cpu``.

    `nnodes` (``--nnodes``) gives the node count of a spec that names none (``8xH100-80GB`` is then
    8 GPUs on each node); a spec that names another count is refused."""
    text = spec.strip()
    if nnodes is not None and nnodes < 1:
        raise RecipeError(f"--nnodes must be >= 1 (got {nnodes})", key="--nnodes")
    if text.lower() == "cpu":
        return Hardware(nodes=nnodes or 1, gpus_per_node=0, accelerator=None, source="--hardware")
    match = _SPEC.match(text)
    if not match:
        raise RecipeError(f"cannot read hardware spec '{spec}'", key="--hardware",
                          hint="use GPUSxNAME (8xH100-80GB), NODESxGPUSxNAME (2x8xA100-80GB) or cpu")
    first, second, name = match.groups()
    if second is not None:
        nodes, gpus = int(first), int(second)
        if nnodes is not None and nnodes != nodes:
            raise RecipeError(f"--nnodes {nnodes} contradicts --hardware {spec} ({nodes} nodes)", key="--nnodes",
                              hint=f"give the node count once: --hardware {spec} alone, or --hardware "
                                   f"{gpus}x{name} --nnodes {nnodes}")
    else:
        nodes, gpus = nnodes or 1, int(first) if first is not None else 1
    if nodes < 1 or gpus < 1:
        raise RecipeError(f"hardware spec '{spec}' needs at least one node and one GPU", key="--hardware",
                          hint="use cpu for a machine without GPUs")
    return Hardware(nodes=nodes, gpus_per_node=gpus, accelerator=lookup_accelerator(name), source="--hardware")


def hardware_for(recipe: Recipe, spec: str | None) -> Hardware:
    """The hardware to plan for: the CLI spec wins, then the recipe's `hardware:` section, then this machine."""
    if spec:
        return parse_hardware(spec)
    section = getattr(recipe, "hardware", None)
    if section is not None:
        if section.gpus_per_node == 0:
            return Hardware(nodes=section.nodes, gpus_per_node=0, accelerator=None, cpu_ram_gb=section.cpu_ram_gb,
                            source="recipe")
        if section.gpu is None:
            local = probe_local_hardware()
            if local.accelerator is None:
                raise RecipeError("hardware.gpu is not set and this machine has no GPU to take it from",
                                  key="hardware.gpu", hint=f"name one: {', '.join(known_accelerators())}")
            acc = local.accelerator
        else:
            acc = lookup_accelerator(section.gpu, key="hardware.gpu")
        return Hardware(nodes=section.nodes, gpus_per_node=section.gpus_per_node, accelerator=acc,
                        cpu_ram_gb=section.cpu_ram_gb, source="recipe")
    return probe_local_hardware()


# ----------------------------------------------------------------------------- local probe

def probe_local_hardware() -> Hardware:
    """This machine: NVML, then nvidia-smi, then (only when a GPU driver is visible) torch.
    A machine without GPUs is a valid CPU-only result; this never raises."""
    ram = _host_ram_gb()
    for probe in (_probe_nvml, _probe_nvidia_smi, _probe_torch):
        try:
            gpus = probe()
        except Exception:  # a broken driver or tool must not stop planning
            gpus = None
        if gpus:
            acc = _match_accelerator(*gpus[0])
            return Hardware(nodes=1, gpus_per_node=len(gpus), accelerator=acc, cpu_ram_gb=ram, source="probe")
    return Hardware(nodes=1, gpus_per_node=0, accelerator=None, cpu_ram_gb=ram, source="probe")


# A probed GPU: (name, memory in GiB, compute capability major or None)
_Probed = tuple[str, float, int | None]


def _probe_nvml() -> list[_Probed] | None:
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml  # noqa: PLC0415 - optional, cheap

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB
            try:
                major = pynvml.nvmlDeviceGetCudaComputeCapability(handle)[0]
            except Exception:
                major = None
            out.append((name, mem, major))
        return out
    finally:
        pynvml.nvmlShutdown()


def _probe_nvidia_smi() -> list[_Probed] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    for fields in ("name,memory.total,compute_cap", "name,memory.total"):
        proc = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
        if proc.returncode == 0:
            return [_smi_row(line) for line in proc.stdout.splitlines() if line.strip()]
    return None


def _smi_row(line: str) -> _Probed:
    parts = [p.strip() for p in line.split(",")]
    major = None
    if len(parts) > 2:
        try:
            major = int(float(parts[2]))
        except ValueError:
            major = None
    return parts[0], float(parts[1]) / 1024.0, major


def _probe_torch() -> list[_Probed] | None:
    # Importing torch costs seconds; only worth it when a GPU driver is present but NVML and
    # nvidia-smi could not be used (e.g. a container without the tools, or ROCm).
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")):
        return None
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # noqa: PLC0415 - deliberately lazy

    if not torch.cuda.is_available():
        return None
    out: list[_Probed] = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append((props.name, props.total_memory / GIB, props.major))
    return out


def _match_accelerator(name: str, memory_gb: float, major: int | None) -> Accelerator:
    """The table entry for a probed GPU (same family, closest memory), else an entry built from
    what the driver said."""
    upper = name.upper().replace(" ", "")
    best = None
    for acc in ACCELERATORS.values():
        family = acc.name.split("-")[0].upper()
        if family in upper and abs(acc.memory_gb - memory_gb) <= 0.1 * acc.memory_gb:
            if best is None or abs(acc.memory_gb - memory_gb) < abs(best.memory_gb - memory_gb):
                best = acc
    if best is not None:
        return replace(best, memory_gb=round(memory_gb, 1))
    bf16 = major is not None and major >= 8
    fp8 = major is not None and major >= 9
    return Accelerator(name=name, memory_gb=round(memory_gb, 1), bf16=bf16, fp8=fp8, peak_tflops=0.0)


def _host_ram_gb() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None
