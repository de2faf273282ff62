"""A backend spec: everything about one distributed backend, in one class.

A backend is one `BackendSpec` subclass in one module (built-ins in `recipeforge.backends`, plugins
in their own package, registered by the entry point group ``recipeforge.backends``). It owns

1. what it runs and the presets it names (`capabilities`, `presets`, `preset`), which the recipe
   rules, the planner and `check` all read;
2. its planning (`plan.backend_spec.PlannerSpec`): the candidate layouts it offers a workload on a
   target, its model-state memory terms, its reasons and its part of the plan;
3. how its processes start: the launcher, the accelerate config section, extra files and environment
   (`launcher`, `accelerate_config`, `launch_files`, `launch_env`);
4. each worker before the trainer exists (`setup_worker`), the trainer's arguments (`trainer_kwargs`,
   merged last by `stages.base.TrainerStage.training_arguments`) and, when it trains with a loop of
   its own, the stage runner (`runner`);
5. the final save as plain Hugging Face safetensors, gathering sharded weights first (`save_final`);
6. what really ran, reported from inside the worker (`runtime_report`, written to backend.json).

Stage runners never look at the backend; a backend never looks at the stage beyond `stages`.
Nothing here imports torch: the heavy work happens inside the methods.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from recipeforge.capabilities import BackendCapabilities, check_plan
from recipeforge.errors import RecipeError
from recipeforge.plan.backend_spec import PlannerSpec

if TYPE_CHECKING:
    import torch

    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer

    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.config.schema import Recipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.stages.context import StageContext, WorkerHooks
    from recipeforge.plan.types import Plan

Log = Callable[[str], None]


@runtime_checkable
class Backend(Protocol):
    """The methods the run calls on every backend (built-ins and plugins alike); `BackendSpec`
    implements them all, with the planning methods of `PlannerSpec`."""

    name: str
    capabilities: BackendCapabilities
    exports_after_job: bool
    reports_runtime: bool

    def check(self, plan: "Plan", recipe: "Recipe") -> None: ...

    def launcher(self, plan: "Plan") -> str: ...

    def accelerate_config(self, plan: "Plan", recipe: "Recipe", run_dir: Path) -> dict[str, Any]: ...

    def launch_files(self, plan: "Plan", recipe: "Recipe") -> dict[str, str]: ...

    def launch_env(self, plan: "Plan") -> dict[str, str]: ...

    def prepare_launch(self, loaded: "LoadedRecipe", plan: "Plan", run: "RunDir", *,
                       log: Log = print) -> Path | None: ...

    def finish_launch(self, loaded: "LoadedRecipe", plan: "Plan", run: "RunDir", *,
                      log: Log = print) -> Path | None: ...

    def runner(self, stage: str) -> str | None: ...

    def setup_worker(self, ctx: StageContext) -> WorkerHooks: ...

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]: ...

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None: ...

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]: ...


class BackendSpec(PlannerSpec):
    """The base of every backend: a backend that drives a transformers/TRL trainer through Accelerate.

    A subclass sets ``name`` and ``capabilities = BackendCapabilities(...)``, declares its presets,
    offers its layouts to the planner (`candidates`) and overrides what it does differently."""

    name = ""
    # final/ (and a LoRA merge) are written after the job by `finish_launch`, not by the workers.
    exports_after_job = False

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this backend runs (from its capability record)."""
        return self.capabilities.stages

    # -- before launch ----------------------------------------------------------------------------
    def check(self, plan: "Plan", recipe: "Recipe") -> None:
        """Refuse a plan this backend cannot run, with the reason and what to do instead."""
        if plan.backend != self.name:
            raise RecipeError(f"the plan uses backend {plan.backend}, not {self.name}", key="distributed.backend")
        self.check_supported(plan, recipe)
        self.check_installed()

    def check_supported(self, plan: "Plan", recipe: "Recipe") -> None:
        """Refuse what the capability record does not run (stage, device, adapter, offload, ...), and
        quantization-aware training where the weights are sharded."""
        check_plan(self.capabilities, plan, recipe)
        if recipe.train.qat is not None and plan.traits.shards_weights:
            # torchao swaps whole nn.Linear modules for fake-quantized ones; a sharded model's weights are
            # DTensors or ZeRO-3 partitions, which the swap does not carry
            raise RecipeError(f"quantization-aware training swaps a whole model's linear layers for torchao's fake-quantized ones, "
                              f"and the plan's {plan.backend} backend ({plan.preset}) shards the weights across "
                              f"processes", key="train.qat",
                              hint="pin distributed.backend: ddp (or deepspeed with distributed.zero_stage: 2), or "
                                   "drop train.qat")

    def check_installed(self) -> None:
        """Refuse when the package this backend needs is missing here (looked up, never imported)."""
        package, extra = self.capabilities.package, self.capabilities.extra
        if package and importlib.util.find_spec(package.split(".")[0]) is None:
            raise RecipeError(f"the {self.name} backend needs the {package} package, which is not installed",
                              key="distributed.backend", hint=f"pip install 'recipeforge[{extra}]'")

    def launcher(self, plan: "Plan") -> str:
        """``accelerate`` (a generated config file in the run dir), ``torchrun``, or ``none`` (this
        process trains)."""
        return "accelerate" if plan.world_size > 1 else "none"

    def accelerate_config(self, plan: "Plan", recipe: "Recipe", run_dir: Path) -> dict[str, Any]:
        """This backend's part of the accelerate config file (distributed type and plugin section)."""
        return {"distributed_type": "MULTI_GPU"}

    def launch_files(self, plan: "Plan", recipe: "Recipe") -> dict[str, str]:
        """Extra files to write into the run directory before launch: name -> text."""
        return {}

    def launch_env(self, plan: "Plan") -> dict[str, str]:
        """Environment variables the workers need beyond the launcher's own."""
        return {}

    def prepare_launch(self, loaded: "LoadedRecipe", plan: "Plan", run: "RunDir", *,
                       log: Log = print) -> Path | None:
        """Run once in the launching process (on the main node) before any worker starts; returns what
        it wrote, if anything (the run does not need it)."""

    def finish_launch(self, loaded: "LoadedRecipe", plan: "Plan", run: "RunDir", *,
                      log: Log = print) -> Path | None:
        """Run once in the launching process (on the main node) after the workers succeeded; returns
        what it wrote, if anything (the run does not need it)."""

    # -- inside each worker -----------------------------------------------------------------------
    def runner(self, stage: str) -> str | None:
        """``"module:Class"`` of the stage runner when this backend trains with a loop of its own,
        else None (the stage's own runner)."""
        return None

    def setup_worker(self, ctx: StageContext) -> WorkerHooks:
        """Run before the model is loaded and before the trainer arguments are built; returns how the
        stage loads the model when this backend loads it its own way (sharded), else no hooks."""
        from recipeforge.stages.context import WorkerHooks

        return WorkerHooks()

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        """Trainer arguments this backend needs (override the stage's and the common ones)."""
        return {}

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        """Write final/ on the main process; every process calls this (gathering may be collective)."""
        from recipeforge.outputs.weights import save_pretrained_atomic
        from recipeforge.stages.precision import final_shard_bytes, final_weights_dtype

        if ctx.dist.is_main:
            save_pretrained_atomic(model, tokenizer, ctx.run.final, dtype=final_weights_dtype(ctx.recipe, ctx.plan),
                                   max_shard_size=final_shard_bytes(ctx.recipe))
        return ctx.run.final

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        """What really ran, seen from inside the worker: backend.json in the run directory."""
        return common_report(trainer)


def common_report(trainer: Trainer) -> dict[str, Any]:
    """The report every backend starts from: distributed type, processes, process group, wrapper, device."""
    import torch.distributed as dist

    state = trainer.accelerator.state
    wrapped = getattr(trainer, "model_wrapped", None)
    return {
        "distributed_type": str(getattr(state.distributed_type, "value", state.distributed_type)),
        "num_processes": state.num_processes,
        "process_group_backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "wrapper": type(wrapped).__name__ if wrapped is not None else None,
        "device": str(state.device),
    }


def streamed_final_save(ctx: StageContext, model: torch.nn.Module,
                        tokenizer: PreTrainedTokenizerBase | ProcessorMixin, sharding: str,
                        holder: torch.nn.Module) -> Path | None:
    """Write final/ from a sharded model's full weights tensor by tensor (`outputs.streamed_save`;
    every rank calls this), so the main process never holds the whole model. `sharding`: how `holder`
    keeps them (`streamed_save.SHARDINGS`: "dtensor", "zero3"). None, with nothing written, for an
    adapter (written from the gathered state dict) or a model whose checkpoint layout combines
    tensors: the caller gathers the state dict then."""
    from recipeforge.outputs.weights import is_peft

    if is_peft(model):
        return None
    from recipeforge.outputs.streamed_save import SHARDINGS, save_streamed
    from recipeforge.stages.precision import final_shard_bytes, final_weights_dtype

    saved = save_streamed(model, SHARDINGS[sharding](holder), tokenizer, ctx.run.final, is_main=ctx.dist.is_main,
                          dtype=final_weights_dtype(ctx.recipe, ctx.plan), max_shard_size=final_shard_bytes(ctx.recipe))
    if saved is None and ctx.dist.is_main:
        from recipeforge.log import log

        log("final/: this model's checkpoint layout combines tensors (weight converters), so its full state "
            "dict is gathered on rank 0 to write it")
    return saved


def full_state_dict_save(ctx: StageContext, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
                         state_dict: dict[str, Any] | None) -> Path:
    """Write final/ from a gathered full state dict (main process only), atomically."""
    from recipeforge.outputs.weights import save_pretrained_atomic
    from recipeforge.stages.precision import final_shard_bytes, final_weights_dtype

    out = ctx.run.final
    if not ctx.dist.is_main:
        return out
    if state_dict is None:
        raise RuntimeError("gathering the sharded weights returned nothing on the main process")
    saved: Path = save_pretrained_atomic(model, tokenizer, out, state_dict=state_dict,
                                         dtype=final_weights_dtype(ctx.recipe, ctx.plan),
                                         max_shard_size=final_shard_bytes(ctx.recipe))
    return saved
