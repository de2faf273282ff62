"""The data the planner produces. Later steps (launch, stage runners) read these fields only.

Field names here are a contract shared with the stage runners and backends: extend, do not rename.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from recipeforge.errors import RecipeError


@dataclass(frozen=True)
class Choice:
    """An automatic (or pinned) decision and why it was made."""

    value: Any
    reason: str


@dataclass(frozen=True)
class PlanExtras:
    """What a plan records beyond its layout: facts for the launch, the backends and the report.

    Typed fields, not a string-keyed mapping, so that a key written and never read (or read and never
    written) cannot exist: a write of an undeclared name is a TypeError, a read an AttributeError.
    Frozen: a later step makes a changed copy with `dataclasses.replace`.
    """

    hardware: dict[str, Any] = field(default_factory=dict)     # `Hardware.to_dict()` of the target
    model: dict[str, Any] = field(default_factory=dict)        # sizes, source, trainable params, decoder layer class
    dtype: str = "fp32"                    # compute dtype: bf16 | fp16 | fp32
    precision: str = ""                    # what is kept in which precision, for the report
    attention: str = ""                    # fused | eager (the memory model's view)
    sequence_len: int = 0
    memory_limit_gb: float = 0.0           # usable memory per GPU (per process on the CPU)
    cpu_memory_gb: float = 0.0             # host RAM per node for offloaded states
    runners_up: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processes_per_node: int | None = None  # CPU runs: gloo processes per node (GPU runs: one per GPU)
    context_parallel: int = 1              # GPUs each sequence is split over (ring attention; FSDP2)
    activations: str = ""                  # the activation-memory terms of the chosen layout, for the report
    accuracy_class: str = ""               # calibrated | sharded | uncalibrated: whose measured spread the band is
    plugins: list[dict[str, Any]] = field(default_factory=list)  # plugin components the recipe uses
    vision: dict[str, Any] = field(default_factory=dict)  # a vision-language model's image side (`vision_report`)
    teacher: dict[str, Any] = field(default_factory=dict)  # distill: the teacher and its GB per GPU (`plan.teacher`)
    phases: list[dict[str, Any]] = field(default_factory=list)  # each phase's peak, GPU and host (`plan.phases`)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "PlanExtras":
        """The extras of a plan.json; an unknown key is an error (a plan from another recipeforge)."""
        raw = dict(raw or {})
        unknown = sorted(set(raw) - _EXTRA_FIELDS)
        if unknown:
            raise RecipeError(f"the plan's extra section has unknown keys: {', '.join(unknown)}",
                              hint="plan again with this recipeforge version (`recipeforge train` rewrites plan.json)")
        return cls(**raw)


_EXTRA_FIELDS = frozenset(f.name for f in fields(PlanExtras))


@dataclass(frozen=True)
class BackendPart:
    """A backend's own settings in a plan, which only that backend reads (DeepSpeed's ZeRO stage,
    FSDP2's sharding and mesh). Each backend spec names its subclass (`PlannerSpec.plan_part_type`);
    this base, with no fields, is the part of a backend that has none."""

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for the plan's text table."""
        return []


@dataclass(frozen=True)
class BackendTraits:
    """What the rest of a run needs to know of the plan's backend, decided with the plan
    (`PlannerSpec.traits`), so the stages, the run's checks and the plan's text never look a backend up by
    its name. Not written to plan.json: the worker decides them again from the same backend."""

    trainer_holds_weights: bool = True       # torch owns full weights and gradients (mixed precision is ours)
    shards_weights: bool = False             # each process keeps a shard of the weights (ZeRO-3, FSDP)
    preset_names_sizes: bool = False         # preset names say the parallel sizes (tp2_pp4)
    checkpoints_master_weights: bool = False  # checkpoints carry fp32 master weights (disk estimate)


@dataclass(frozen=True)
class Plan:
    """How a recipe runs on given hardware."""

    backend: str                  # a registered backend spec's name (`capabilities.BackendName` or a plugin's)
    preset: str | None            # e.g. "zero3_offload", "fsdp_full_shard"; None for single/ddp
    device: str                   # "cuda" | "cpu"
    nodes: int
    gpus_per_node: int
    world_size: int               # training processes (1 for single-device / CPU runs)
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    micro_batch_size: int
    gradient_accumulation: int
    global_batch_size: int        # micro_batch_size * gradient_accumulation * data_parallel
    gradient_checkpointing: bool
    offload: str                  # "none" | "optimizer" | "optimizer+params"
    # With gradient_checkpointing: "full" (a layer's input kept, the rest recomputed) or "selective"
    # (matmul and attention outputs kept); `checkpoint_every` N: full checkpointing of every N-th layer.
    checkpoint_mode: str = "full"
    checkpoint_every: int = 1
    backend_part: BackendPart = field(default_factory=BackendPart)  # the backend's own settings
    memory_gb: dict[str, float] = field(default_factory=dict)   # per-GPU estimate by component
    reasons: dict[str, Choice] = field(default_factory=dict)    # per decision
    extra: PlanExtras = field(default_factory=PlanExtras)
    traits: BackendTraits = field(default_factory=BackendTraits, compare=False)  # of `backend`

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready representation (written to plan.json; `backends.worker.plan_from_dict` reads it).
        The traits are left out: they follow from the backend; `extra.teacher` is left out when empty."""
        out = asdict(self)
        out.pop("traits")
        if not out["extra"]["teacher"]:  # only distillation has a teacher: other plans' JSON is what it was
            out["extra"].pop("teacher")
        return out
