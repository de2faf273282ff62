"""The backend protocol: what a distributed backend contributes to a run, and nothing else.

A backend is chosen by the plan (`Plan.backend`) and looked up in the ``backends`` registry. It

1. checks the plan against what it can run (`check`),
2. says how to start the processes: which launcher, the accelerate config section, extra files and
   environment (`launcher`, `accelerate_config`, `launch_files`, `launch_env`),
3. sets up each worker before the trainer exists (`setup_worker`) and gives the trainer its
   arguments (`trainer_kwargs`, merged last by `stages.base.TrainerStage.training_arguments`),
4. writes final/ as plain Hugging Face safetensors, gathering sharded weights first (`save_final`,
   which the runner hands to the stage as `StageContext.save_final`),
5. reports what really ran, from inside the worker (`runtime_report`, written to backend.json).

Stage runners never look at the backend; a backend never looks at the stage beyond `stages`.
Nothing here imports torch: the heavy work happens inside the methods.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from recipeforge.capabilities import BackendCapabilities, capabilities_of, check_plan
from recipeforge.errors import RecipeError

TRAINER_STAGES = ("pretrain", "sft", "dpo", "grpo", "orpo", "kto", "cpo", "reward")


@runtime_checkable
class Backend(Protocol):
    """What every backend implements (built-ins and plugins alike)."""

    name: str
    stages: tuple[str, ...]

    def check(self, plan, recipe) -> None: ...

    def launcher(self, plan) -> str: ...

    def accelerate_config(self, plan, recipe, run_dir: Path) -> dict: ...

    def launch_files(self, plan, recipe) -> dict[str, str]: ...

    def launch_env(self, plan) -> dict[str, str]: ...

    def setup_worker(self, ctx) -> None: ...

    def trainer_kwargs(self, ctx) -> dict: ...

    def save_final(self, ctx, trainer, model, tokenizer) -> Path | None: ...

    def runtime_report(self, trainer) -> dict: ...


class TrainerBackend:
    """Shared behaviour of the backends that drive a transformers/TRL trainer through Accelerate.

    What a backend runs is its capability record (`recipeforge.capabilities`): built-ins find theirs
    by name, a plugin backend sets ``capabilities = BackendCapabilities(...)`` on its class. The recipe
    rules and the planner read the same record, so `check` refuses nothing they let through."""

    name = ""

    @property
    def capabilities(self) -> BackendCapabilities:
        """This backend's capability record."""
        return capabilities_of(self.name)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this backend runs (from its capability record)."""
        return self.capabilities.stages

    # -- before launch ----------------------------------------------------------------------------
    def check(self, plan, recipe) -> None:
        """Refuse a plan this backend cannot run, with the reason and what to do instead."""
        if plan.backend != self.name:
            raise RecipeError(f"the plan uses backend {plan.backend}, not {self.name}", key="distributed.backend")
        self.check_supported(plan, recipe)
        self.check_installed()

    def check_supported(self, plan, recipe) -> None:
        """Refuse what the capability record does not run (stage, device, adapter, offload, ...)."""
        check_plan(self.capabilities, plan, recipe)

    def check_installed(self) -> None:
        """Refuse when the package this backend needs is missing here (looked up, never imported)."""
        package, extra = self.capabilities.package, self.capabilities.extra
        if package and importlib.util.find_spec(package.split(".")[0]) is None:
            raise RecipeError(f"the {self.name} backend needs the {package} package, which is not installed",
                              key="distributed.backend", hint=f"pip install 'recipeforge[{extra}]'")

    def launcher(self, plan) -> str:
        """``accelerate`` (a generated config file in the run dir) or ``none`` (this process trains)."""
        return "accelerate" if plan.world_size > 1 else "none"

    def accelerate_config(self, plan, recipe, run_dir: Path) -> dict:
        """This backend's part of the accelerate config file (distributed type and plugin section)."""
        return {"distributed_type": "MULTI_GPU"}

    def launch_files(self, plan, recipe) -> dict[str, str]:
        """Extra files to write into the run directory before launch: name -> text."""
        return {}

    def launch_env(self, plan) -> dict[str, str]:
        """Environment variables the workers need beyond the launcher's own."""
        return {}

    # -- inside each worker -----------------------------------------------------------------------
    def setup_worker(self, ctx) -> None:
        """Run before the model is loaded and before the trainer arguments are built."""

    def trainer_kwargs(self, ctx) -> dict:
        """Trainer arguments this backend needs (override the stage's and the common ones)."""
        return {}

    def save_final(self, ctx, trainer, model, tokenizer) -> Path | None:
        """Write final/ on the main process; every process calls this (gathering may be collective)."""
        from recipeforge.outputs.export import save_pretrained_atomic

        if ctx.dist.is_main:
            save_pretrained_atomic(model, tokenizer, ctx.run.final)
        return ctx.run.final

    def runtime_report(self, trainer) -> dict:
        """What really ran, seen from inside the worker: backend.json in the run directory."""
        return _common_report(trainer)


def _common_report(trainer) -> dict:
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


def full_state_dict_save(ctx, model, tokenizer, state_dict: dict[str, Any] | None) -> Path:
    """Write final/ from a gathered full state dict (main process only), atomically."""
    from recipeforge.outputs.export import save_pretrained_atomic

    out = ctx.run.final
    if not ctx.dist.is_main:
        return out
    if state_dict is None:
        raise RuntimeError("gathering the sharded weights returned nothing on the main process")
    return save_pretrained_atomic(model, tokenizer, out, state_dict=state_dict)
