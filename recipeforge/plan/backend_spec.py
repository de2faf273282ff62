"""What the planner asks of a backend: the planning half of a backend spec.

`PlannerSpec` is the base of every backend spec (`backends.base.BackendSpec` adds launching, the
worker and the final save). The planner never names a backend: it loops over the specs its caller
hands it (`plan.planners.Planners`), asks each for the layouts it offers a workload on a target
(`candidates`), sizes each layout with the spec's model-state memory terms (`model_states` and the
traits below), and writes the chosen spec's reasons and plan part (`plan_reasons`, `plan_part`).

The defaults describe a backend whose trainer holds a full replica of the model on every process,
as one device and DDP do; a sharding engine overrides what differs. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recipeforge.capabilities import BackendCapabilities, Preset

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.train_phase import Gathered
    from recipeforge.plan.types import BackendPart, BackendTraits, Choice, Plan
    from recipeforge.plan.workload import Workload


@dataclass(frozen=True)
class Candidate:
    """A layout a backend offers, its place in the preference order, and what it does.

    Candidates of every backend are tried in ``(tier, within)`` order, the first that fits wins:
    tier 0 one GPU, 1 replicas, 2 sharded states with whole weights, 3 fully sharded, 4 model
    parallel, 5 model parallel with offload, 6 optimizer offload, 7 parameter offload (docs/planner.md).
    ``within`` orders a tier: the backend that needs no extra package comes first."""

    layout: "Layout"
    tier: int
    why: str  # what this layout does, for reasons and runners-up
    within: float = 0.0

    @property
    def order(self) -> tuple[float, float]:
        return (self.tier, self.within)


@dataclass(frozen=True)
class CpuSpread:
    """A backend's settings when a one-process CPU plan is spread over several gloo processes."""

    preset: str | None = None
    zero_stage: int | None = None
    offload: str = "none"
    fsdp_sharding: str | None = None
    tensor_parallel: int = 1
    part: Any = None                   # the plan's `BackendPart` (None: the base, no settings)


class PlannerSpec:
    """The planning methods of a backend spec, with the defaults of a full replica per process."""

    # The `BackendPart` subclass its `plan_part` returns (None: the base).
    plan_part_type: type[BackendPart] | None = None

    name: str = ""
    capabilities: BackendCapabilities
    presets: tuple[Preset, ...] = ()
    # Order among the backends tried for a CPU run in auto mode (None: used on the CPU only when pinned).
    cpu_preference: int | None = None
    # The trainer itself holds full weights and gradients (torch owns them): mixed precision keeps fp32
    # weights under autocast, and `train.precision` is this backend's to choose.
    trainer_holds_weights: bool = True
    # Full fine-tuning gradients are allocated in backward and freed by zero_grad (not engine buffers).
    torch_allocates_gradients: bool = True
    # Megatron-style sequence parallel: activations outside attention split over the tensor ranks.
    sequence_parallel: bool = False
    # The only micro batch this backend trains with (None: the planner chooses).
    fixed_micro_batch: int | None = None
    # Its preset names say the parallel sizes (tp2_pp4): labels and the plan table need not repeat them.
    preset_names_sizes: bool = False
    # Whether the run writes backend.json (what really ran) for this backend.
    reports_runtime: bool = True
    # Whether its checkpoints carry fp32 master weights beside the optimizer states (disk estimate).
    checkpoints_master_weights: bool = False

    # -- presets ----------------------------------------------------------------------------------
    def preset(self, name: str) -> Preset | None:
        """The preset called `name` if this backend declares it, else None."""
        return next((p for p in self.presets if p.name == name), None)

    def preset_names(self) -> list[str]:
        """The names of this backend's presets (a generated family as its pattern)."""
        return [p.name for p in self.presets]

    # -- candidate layouts -------------------------------------------------------------------------
    def candidates(self, w: "Workload", hw: "Hardware", dist: "DistributedConfig | None", *,
                   pinned: bool) -> list[Candidate]:
        """The GPU layouts this backend offers for `w` on `hw`. `pinned`: the recipe names this
        backend (or asks for every preset name), so layouts it would not offer on its own count too.
        `dist` is the recipe's distributed section (None when only preset names are wanted)."""
        return []

    def cpu_candidate(self, dist: "DistributedConfig") -> Candidate:
        """The one-process CPU layout of this backend with the recipe's pins."""
        from recipeforge.plan.memory import Layout

        return Candidate(Layout(self.name, None, nodes=1, gpus_per_node=0), 1,
                         f"{self.name} on the CPU (gloo), one process planned")

    def cpu_spread(self, dist: "DistributedConfig") -> CpuSpread:
        """This backend's settings for a CPU job of several gloo processes."""
        return CpuSpread()

    def matches_pins(self, layout: "Layout", dist: "DistributedConfig") -> bool:
        """Whether `layout` has the backend-specific settings the recipe pins (beyond backend,
        preset, ZeRO stage, offload and parallel sizes, which the planner checks)."""
        return True

    # -- memory terms -----------------------------------------------------------------------------
    def shards_weights(self, layout: "Layout") -> bool:
        """Whether each process keeps only a shard of the weights (a QLoRA base then keeps its
        non-quantized weights in the compute dtype, and a reference model is sharded too)."""
        return False

    def rank0_loads_whole(self, w: "Workload", layout: "Layout") -> bool:
        """Whether the first process reads the whole model into host memory to hand out the shards (the
        load phase's rank-0 host peak, `plan.phases`)."""
        return False

    def streams_final_save(self, w: "Workload", layout: "Layout") -> bool:
        """Whether a full fine-tune whose weights are sharded over processes writes final/ tensor by
        tensor (rank 0 holds one tensor at a time) rather than from a full state dict gathered on rank 0
        (the save phase's rank-0 host peak, `plan.phases`)."""
        return False

    def model_states(self, w: "Workload", layout: "Layout", part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        """Fill `part` (bytes per GPU by component) with the weights, gradients, optimizer states and
        buffers this backend keeps; return the host bytes per node it offloads. `frozen_bytes`: the
        frozen weights (a QLoRA base quantized) before any sharding."""
        from recipeforge.plan.memory import replica_states

        return replica_states(w, layout, part, trainable, frozen_bytes)

    def gathered(self, w: "Workload", layout: "Layout", engine_gathered: float) -> "Gathered":
        """What the engine holds unsharded at each moment of a step (`train_phase.Gathered`)."""
        from recipeforge.plan.train_phase import Gathered

        return Gathered.constant(engine_gathered)

    def holds_layer_gradient(self, w: "Workload") -> bool:
        """Whether a layer's weight gradient stays unsharded in the compute dtype until the layer's
        reduce-scatter (FSDP2), instead of going into `.grad` or an engine's bucket."""
        return False

    def accuracy_band(self, w: "Workload", layout: "Layout") -> str:
        """Which calibration band the estimate falls in: ``calibrated``, ``sharded`` or ``uncalibrated``."""
        return "sharded" if layout.offload != "none" else "calibrated"

    def precision(self, w: "Workload") -> str:
        """What is kept in which precision with full fine-tuning in 16 bits, for the plan."""
        if w.dtype == "fp16" or w.fp32_master:
            return f"fp32 weights with {w.dtype} autocast; fp32 gradients and optimizer states"
        return f"{w.dtype} weights, gradients and optimizer states (no fp32 master copy)"

    # -- the plan ---------------------------------------------------------------------------------
    def plan_reasons(self, layout: "Layout", dist: "DistributedConfig", w: "Workload") -> dict[str, "Choice"]:
        """This backend's own entries in the plan's reasons (parallel sizes it chose, ...)."""
        return {}

    def plan_part(self, layout: "Layout") -> "BackendPart":
        """This backend's own settings for the plan (`plan.types.BackendPart`, or its subclass)."""
        from recipeforge.plan.types import BackendPart

        return BackendPart()

    def part_from_dict(self, raw: dict[str, Any]) -> "BackendPart":
        """The plan part of a plan.json (the form `plan_part` writes); an unknown key is an error."""
        from dataclasses import fields

        from recipeforge.errors import RecipeError
        from recipeforge.plan.types import BackendPart

        kind = self.plan_part_type or BackendPart
        unknown = sorted(set(raw) - {f.name for f in fields(kind)})
        if unknown:
            raise RecipeError(f"the plan's backend_part has keys backend {self.name} does not know: "
                              f"{', '.join(unknown)}", hint="plan again with this recipeforge version "
                                                             "(`recipeforge train` rewrites plan.json)")
        return kind(**raw)

    def plan_shards_weights(self, plan: "Plan") -> bool:
        """`shards_weights` for a finished plan, as a training process sees it."""
        return False

    def traits(self, plan: "Plan") -> "BackendTraits":
        """What the rest of the run needs to know of this backend for `plan` (`Plan.traits`)."""
        from recipeforge.plan.types import BackendTraits

        return BackendTraits(trainer_holds_weights=self.trainer_holds_weights,
                             shards_weights=self.plan_shards_weights(plan),
                             preset_names_sizes=self.preset_names_sizes,
                             checkpoints_master_weights=self.checkpoints_master_weights)

    def recipe_refusals(self, recipe: "Recipe") -> list[tuple[str, str]]:
        """(key, message) for recipe settings this backend cannot run, beyond its capability record."""
        return []
