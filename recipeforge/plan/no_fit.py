"""The error of a recipe nothing fits: the closest layout, by how much it is short, and what would fit
(an adapter, more GPUs of the same kind, offload with its host RAM, another backend than the pinned one)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

from recipeforge.config.schema.distributed import PARALLEL_SIZE_KEYS
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.models import human_count
from recipeforge.plan.pins import pinned
from recipeforge.plan.policy import Decision, decide, pinned_refusals
from recipeforge.plan.teacher_memory import teacher_alternatives
from recipeforge.plan.workload import Workload, lora_targets
from recipeforge.stage_specs import Stage, stage_spec

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.planners import Planners


def raise_no_fit(recipe: Recipe, w: Workload, hw: Hardware, decision: Decision, planners: Planners) -> NoReturn:
    """Raise the `RecipeError` of a decision that chose nothing: a pin no layout satisfies, a batch that does
    not split, or the closest layout's shortfall with the alternatives that would fit."""
    evs = decision.evaluations
    if not evs:
        refused = pinned_refusals(w, hw, recipe.distributed, planners)
        if refused:  # the pins leave layouts, and the recipe's method refuses each: say the first one's why
            raise refused[0].error()
        raise RecipeError(f"no {', '.join(pinned(recipe))} layout exists for {hw.describe()}",
                          key="distributed", hint="check the pinned parallel sizes against the GPU count, "
                                                  "or set distributed.backend: auto")
    batch_only = [e for e in evs if e.memory.total <= e.limit and e.memory.cpu_per_node <= e.cpu_limit]
    if batch_only:
        e = batch_only[0]
        key = "train.micro_batch_size" if isinstance(recipe.train.micro_batch_size, int) else "train.global_batch_size"
        multiple = e.micro_batch * e.layout.data_parallel
        stage = stage_spec(recipe.stage)
        least = f" ({stage.needs_rows})" if e.micro_batch == stage.min_micro_batch > 1 else ""
        raise RecipeError(f"{e.problem}{least}, so gradient accumulation would not be a whole number", key=key,
                          hint=f"use a global batch that is a multiple of {multiple} "
                               f"(e.g. {multiple * max(1, round(recipe.train.global_batch_size / multiple))})")
    on_gpu = [e for e in evs if e.layout.offload == "none"] or evs
    closest = min(on_gpu, key=lambda e: e.shortfall)
    what = _describe_training(recipe, w)
    head = (f"{what} does not fit on {hw.describe()}: the closest plan, {closest.layout.label}, "
            f"{closest.problem} ({closest.shortfall / GIB:.1f} GB short"
            + (f", {hw.gpu_memory_gb:.1f} GB GPUs at {recipe.distributed.memory_headroom:.0%} headroom)"
               if hw.device == "cuda" else ")"))
    pins = pinned(recipe)
    if pins:
        head = f"pinned {', '.join(pins)}: " + head
    raise RecipeError(head, key="distributed" if pins else "model.name_or_path",
                      hint="what would fit: " + "; ".join(_alternatives(recipe, w, hw, planners)))


def _describe_training(recipe: Recipe, w: Workload) -> str:
    size = human_count(w.model.total_params())
    kind = {"none": "full fine-tune" if recipe.stage != Stage.PRETRAIN else "pretraining",
            "lora": "LoRA", "qlora": "QLoRA"}[w.adapter]
    teacher = w.teacher
    with_teacher = ""
    if teacher is not None and teacher.colocated and teacher.model is not None:
        with_teacher = (f" with a colocated {human_count(teacher.model.total_params())} teacher"
                        f"{' (4-bit)' if teacher.load_in_4bit else ''} whole on every GPU")
    return f"{recipe.stage} ({kind}) of {recipe.model.name_or_path} ({size} parameters){with_teacher}"


def _alternatives(recipe: Recipe, w: Workload, hw: Hardware, planners: Planners) -> list[str]:
    """Computed suggestions: an adapter, more GPUs of the same kind, offload (with its host RAM)."""
    out: list[str] = []
    auto = recipe.distributed.model_copy(update={"backend": "auto", "preset": None, "zero_stage": "auto",
                                                 "offload": "auto", "pipeline_parallel": 1,
                                                 **dict.fromkeys(PARALLEL_SIZE_KEYS, "auto")})
    if pinned(recipe):
        d = decide(w, hw, auto, recipe.train, planners)
        if d.chosen is not None:
            return [f"distributed.backend: auto would choose {d.chosen.layout.label} "
                    f"({d.chosen.memory.total / GIB:.1f} GB per GPU)"]
    if hw.device == "cuda":
        def fits(alt: Workload) -> tuple[str, float] | None:
            d = decide(alt, hw, auto, recipe.train, planners)
            return (d.chosen.layout.label, d.chosen.memory.total / GIB) if d.chosen is not None else None

        out.extend(teacher_alternatives(w, fits))
        for adapter in ("qlora", "lora") if w.adapter != "qlora" else ():
            if w.adapter == "lora" and adapter == "lora":
                continue
            alt = _with_adapter(w, adapter, hw)
            d = decide(alt, hw, auto, recipe.train, planners)
            if d.chosen is not None:
                out.append(f"adapter.type: {adapter} fits ({d.chosen.layout.label}, "
                           f"{d.chosen.memory.total / GIB:.1f} GB per GPU)")
                break
            need = min(e.memory.total for e in d.evaluations if e.memory.cpu_per_node == 0) if d.evaluations else 0
            out.append(f"adapter.type: {adapter} would need {need / GIB:.1f} GB per GPU")
        more = _more_gpus(recipe, w, hw, auto, planners)
        if more:
            out.append(more)
        offload = [e for e in decide(w, hw, auto, recipe.train, planners).evaluations if e.layout.offload != "none"]
        if offload:
            best = min(offload, key=lambda e: e.shortfall)
            ram, known = hw.host_ram_gb()
            out.append(f"offload ({best.layout.label}) needs {best.memory.total / GIB:.1f} GB per GPU and "
                       f"{best.memory.cpu_per_node / GIB:.0f} GB of host RAM per node "
                       f"({'this machine has' if known else 'assumed'} {ram:.0f} GB)")
    else:
        out.append("a GPU machine (plan or launch for one with --hardware 1xH100-80GB, ...) or a smaller model")
    return out or ["a smaller model or sequence length"]


def _with_adapter(w: Workload, adapter: str, hw: Hardware) -> Workload:
    dtype = w.dtype if w.dtype != "fp32" else ("bf16" if hw.accelerator and hw.accelerator.bf16 else "fp16")
    return replace(w, adapter=adapter, lora_rank=w.lora_rank or 16,
                   lora_linears=w.lora_linears or lora_targets(w.model, "all-linear"),
                   dtype=dtype, reference_model=False)


def _more_gpus(recipe: Recipe, w: Workload, hw: Hardware, auto: DistributedConfig, planners: Planners) -> str | None:
    per_node = max(8, hw.gpus_per_node)
    current = hw.num_gpus
    n = 2
    while n <= 4096:
        if n > current:
            nodes, gpus = (1, n) if n <= per_node else (n // per_node, per_node)
            bigger = Hardware(nodes=nodes, gpus_per_node=gpus, accelerator=hw.accelerator, source=hw.source)
            # more ranks may need a larger global batch: the smallest multiple of n not below the recipe's
            batch = n * -(-recipe.train.global_batch_size // n)
            train = recipe.train.model_copy(update={"global_batch_size": batch})
            d = decide(w, bigger, auto, train, planners)
            if d.chosen is not None:
                note = f", global batch {batch}" if batch != recipe.train.global_batch_size else ""
                return (f"{bigger.describe()} ({d.chosen.layout.label}, "
                        f"{d.chosen.memory.total / GIB:.1f} GB per GPU{note})")
        n *= 2
    return None
