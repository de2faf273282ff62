"""`make_plan`: recipe + hardware -> `Plan`, every choice with its reason."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

from recipeforge.capabilities import parallel_key
from recipeforge.capabilities import refusals as capability_refusals
from recipeforge.components.qat import export_format as qat_export_format
from recipeforge.errors import RecipeError, did_you_mean
from recipeforge.plan.accuracy import accuracy_band, band_class, sensitivity
from recipeforge.plan.catalog import resolve_model
from recipeforge.plan.fp8 import check_hardware as check_fp8_hardware, reason as fp8_reason
from recipeforge.plan.hardware import GIB, Hardware, hardware_for
from recipeforge.plan import policy
from recipeforge.plan.activations import activation_terms
from recipeforge.plan.memory import autocast_fp32_weights
from recipeforge.plan.models import human_count
from recipeforge.plan.optim_in_backward import check_in_backward_hardware
from recipeforge.plan.phases import check_host_phases, phase_peaks
from recipeforge.plan.planners import Planners
from recipeforge.plan.parallel_layouts import check_pinned_sizes, parallel_reasons
from recipeforge.config.schema.distributed import PARALLEL_SIZE_KEYS
from recipeforge.plan.experts import expert_reasons, expert_warnings
from recipeforge.plan.presets import get_preset
from recipeforge.plan.policy import Decision, Evaluation, decide, install_hint, known_presets, pinned_refusals
from recipeforge.plan.precision import choose_precision, tf32_choice
from recipeforge.plan.teacher_memory import teacher_alternatives, teacher_reason, teacher_summary
from recipeforge.plan.types import Choice, Plan, PlanExtras
from recipeforge.plan.vision_report import vision_summary
from recipeforge.plan.vocab import vocab_choice
from recipeforge.plan.workload import Workload, build_workload, lora_targets
from recipeforge.stage_specs import STAGE_SPECS, Stage

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.train import TrainConfig
    from recipeforge.plan.backend_spec import PlannerSpec


def make_plan(recipe: Recipe, hardware: Hardware | None = None, planners: Planners | None = None) -> Plan:
    """Plan `recipe` on `hardware` (default: `hardware_for(recipe, None)`) with the backends of
    `planners` (default: every installed one, `Planners.installed()`).

    Raises `RecipeError` when nothing fits (saying by how much and what would), when a pinned
    layout does not fit, or when the batch sizes cannot be split over the data-parallel ranks.
    """
    hw = hardware if hardware is not None else hardware_for(recipe, None)
    planners = planners if planners is not None else Planners.installed()
    spec, model_source = resolve_model(recipe.model.name_or_path, recipe.model.revision)
    w = build_workload(recipe, spec, hw, planners)
    dist = recipe.distributed
    _check_pins(recipe, w, hw, planners)
    check_pinned_sizes(w, hw, dist, planners)

    check_fp8_hardware(recipe, hw)
    check_in_backward_hardware(recipe.train.optimizer_in_backward, dist.backend, hw)
    # train.precision: fp32 master weights or pure bf16 (auto: by what fits), then the layout for it
    w, decision, precision = choose_precision(recipe, w, hw.device, lambda wl: decide(wl, hw, dist, recipe.train, planners),
                                                 planners)
    if decision.chosen is None:
        _raise_no_fit(recipe, w, hw, decision, planners)
    ev = decision.chosen
    peaks = phase_peaks(recipe, w, hw, ev)  # the whole run's: load, train, eval, save, merge
    short = check_host_phases(peaks, hw, dist.memory_headroom)
    if short is not None:
        decision.warnings.append(short)
    plan = _build_plan(recipe, w, hw, ev, decision, model_source)
    plan = replace(plan, extra=replace(plan.extra, phases=[p.as_dict() for p in peaks]))
    # Workers read the precision from its reason's value (`stages.precision`); tf32 is settled on the GPU.
    added = {"precision": precision, "tf32": tf32_choice(recipe, hw), "added_tokens": vocab_choice(recipe),
             "fp8": fp8_reason(recipe, w, ev.layout.spec.shards_weights(ev.layout), ev.layout.tensor_parallel)
             if recipe.train.precision == "fp8" else None}
    moe = expert_reasons(recipe, w, hw, ev)  # MoE models: experts implementation, expert parallel
    added.update(moe)
    plan = replace(plan, reasons={**plan.reasons, **{k: v for k, v in added.items() if v is not None}})
    over = expert_warnings(moe, ev)
    return replace(plan, extra=replace(plan.extra, warnings=[*plan.extra.warnings, *over])) if over else plan


# ----------------------------------------------------------------------------- pins and errors

def _check_pins(recipe: Recipe, w: Workload, hw: Hardware, planners: Planners) -> None:
    dist = recipe.distributed
    if dist.backend != "auto":
        # The pinned backend's capability record, the same one the recipe rules and `check()` read;
        # a pinned preset stands for its ZeRO stage and offload.
        zero: int | str = dist.zero_stage  # a preset's stage (an int) may replace the recipe's (or `auto`)
        offload: str = dist.offload
        if dist.preset:
            preset = get_preset(dist.preset, backend=dist.backend)
            zero = preset.zero_stage if preset.zero_stage is not None else zero
            offload = preset.offload
        found = capability_refusals(planners.capabilities(dist.backend), stage=recipe.stage, device=hw.device,
                                    adapter=w.adapter, quant_bits=w.quant_bits, offload=offload,
                                    zero_stage=zero, optimizer=w.optimizer,
                                    model_parallel=parallel_key(dist.tensor_parallel, dist.pipeline_parallel,
                                                                dist.context_parallel))
        if found:
            raise found[0].error()
    if dist.preset and hw.device == "cuda":
        presets = known_presets(w, hw, planners, dist.backend)
        if dist.preset not in presets:
            raise RecipeError(f"unknown preset '{dist.preset}' for backend {dist.backend} on {hw.describe()}",
                              key="distributed.preset",
                              hint=(did_you_mean(dist.preset, presets) or "") + f" presets: {', '.join(presets)}")


def _pinned(recipe: Recipe) -> list[str]:
    d = recipe.distributed
    out = []
    if d.backend != "auto":
        out.append(f"backend: {d.backend}")
    if d.preset:
        out.append(f"preset: {d.preset}")
    if d.zero_stage != "auto":
        out.append(f"zero_stage: {d.zero_stage}")
    if d.offload != "auto":
        out.append(f"offload: {d.offload}")
    if d.pipeline_parallel > 1:
        out.append(f"pipeline_parallel: {d.pipeline_parallel}")
    for key in PARALLEL_SIZE_KEYS:
        if d.pinned_size(key) is not None:
            out.append(f"{key}: {d.pinned_size(key)}")
    return out


def _raise_no_fit(recipe: Recipe, w: Workload, hw: Hardware, decision: Decision, planners: Planners) -> NoReturn:
    evs = decision.evaluations
    if not evs:
        refused = pinned_refusals(w, hw, recipe.distributed, planners)
        if refused:  # the pins leave layouts, and the recipe's method refuses each: say the first one's why
            raise refused[0].error()
        raise RecipeError(f"no {', '.join(_pinned(recipe))} layout exists for {hw.describe()}",
                          key="distributed", hint="check the pinned parallel sizes against the GPU count, "
                                                  "or set distributed.backend: auto")
    batch_only = [e for e in evs if e.memory.total <= e.limit and e.memory.cpu_per_node <= e.cpu_limit]
    if batch_only:
        e = batch_only[0]
        key = "train.micro_batch_size" if isinstance(recipe.train.micro_batch_size, int) else "train.global_batch_size"
        multiple = e.micro_batch * e.layout.data_parallel
        stage = STAGE_SPECS[Stage(recipe.stage)]
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
    pins = _pinned(recipe)
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
    if _pinned(recipe):
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


# ----------------------------------------------------------------------------- the plan

def _build_plan(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, decision: Decision,
                model_source: str) -> Plan:
    layout = ev.layout
    device = hw.device
    limit_gb = ev.limit / GIB
    spec = layout.spec
    terms = _activation_terms(w, ev, spec)
    # The insertion order of `reasons` is the order the text and JSON forms print them in.
    reasons: dict[str, Choice] = {}
    reasons.update(_source_reasons(recipe, w, hw, model_source))
    reasons.update(_layout_reasons(recipe, w, hw, ev, decision, spec, limit_gb))
    reasons.update(parallel_reasons(layout, recipe.distributed, w,
                                    ev.memory.components.get("activations", 0.0) / GIB, terms))
    reasons.update(_step_reasons(recipe, ev))
    reasons.update(_memory_reasons(recipe, w, hw, ev, limit_gb))
    from recipeforge.plan.rollout_split import rollout_reasons
    from recipeforge.stage_specs import rl_section

    rl = rl_section(recipe)
    reasons.update(rollout_reasons(w, hw, ev, limit_gb, group=rl[1].num_generations if rl is not None else 1))
    teacher = teacher_reason(w, ev.memory.gb(), ev.micro_batch)
    if teacher is not None:
        reasons["teacher"] = Choice(*teacher)
    extra = _plan_extras(w, hw, ev, decision, spec, model_source, limit_gb, terms)
    plan = Plan(
        backend=layout.backend, preset=layout.preset, device=device,
        nodes=layout.nodes if device == "cuda" else 1,
        gpus_per_node=layout.gpus_per_node if device == "cuda" else 0,
        world_size=max(1, layout.world_size),
        data_parallel=layout.data_parallel, tensor_parallel=layout.tensor_parallel,
        pipeline_parallel=layout.pipeline_parallel, micro_batch_size=ev.micro_batch,
        gradient_accumulation=ev.accumulation,
        global_batch_size=ev.micro_batch * ev.accumulation * layout.data_parallel,
        gradient_checkpointing=ev.checkpointing, checkpoint_mode=w.checkpoint_mode, checkpoint_every=w.checkpoint_every,
        offload=layout.offload, backend_part=spec.plan_part(layout),
        memory_gb=ev.memory.gb(), reasons=reasons, extra=extra)
    return replace(plan, traits=spec.traits(plan))


def _source_reasons(recipe: Recipe, w: Workload, hw: Hardware, model_source: str) -> dict[str, Choice]:
    """Where the hardware, the model's size and the dtype came from."""
    reasons: dict[str, Choice] = {}
    where = {"--hardware": "from --hardware", "recipe": "from the recipe's hardware: section",
             "probe": "probed on this machine"}
    reasons["hardware"] = Choice(hw.describe(), where[hw.source])
    active = f"; {human_count(w.model.active_params())} active per token" if w.model.is_moe else ""
    head = (f"; a {w.model.num_labels}-output sequence-classification head in place of the LM head"
            if w.model.num_labels else "")
    reasons["model"] = Choice(f"{human_count(w.model.total_params())} params",
                              f"counted from {model_source}{active}{head}")
    if recipe.model.dtype != "auto":
        dtype_why = "recipe sets it"
    elif hw.device == "cpu":
        dtype_why = "auto: fp32 on the CPU"
    else:
        assert hw.accelerator is not None  # a GPU target has one (`Hardware.device`)
        dtype_why = f"auto: {hw.accelerator.name} {'supports' if hw.accelerator.bf16 else 'lacks'} bf16"
    reasons["dtype"] = Choice(w.dtype, dtype_why)
    return reasons


def _layout_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, decision: Decision, spec: PlannerSpec,
                    limit_gb: float) -> dict[str, Choice]:
    """Why this backend and preset, the backend's own reasons, and the data-parallel size."""
    layout = ev.layout
    gpus_used = layout.nodes * layout.gpus_per_node if hw.device == "cuda" else 0
    reasons: dict[str, Choice] = {}
    reasons["backend"] = Choice(layout.backend, _backend_reason(ev, decision, _pinned(recipe), limit_gb))
    reasons["preset"] = Choice(layout.preset, ev.candidate.why)
    reasons.update(spec.plan_reasons(layout, recipe.distributed, w))
    reasons["data_parallel"] = Choice(layout.data_parallel, f"{gpus_used or 1} process(es) / model-parallel size "
                                      f"{layout.world_size // max(1, layout.data_parallel)}")
    return reasons


def _activation_terms(w: Workload, ev: Evaluation, spec: PlannerSpec) -> str:
    """The activation estimate's terms for one micro batch on the chosen layout."""
    layout = ev.layout
    tokens = ev.micro_batch * w.sequences_per_sample * w.seq_len
    terms = activation_terms(w, tokens, layers=w.model.num_layers, checkpointing=ev.checkpointing,
                             tensor_parallel=layout.tensor_parallel, context_parallel=layout.context_parallel,
                             sequence_parallel=spec.sequence_parallel,
                             fp32_weights=autocast_fp32_weights(w, layout))
    if ev.memory.train_peak:  # the memory table shows the train phase at this moment
        terms += f"; the train phase peaks at {ev.memory.train_peak}"
    return terms


def _step_reasons(recipe: Recipe, ev: Evaluation) -> dict[str, Choice]:
    """Batch split, checkpointing, ZeRO stage and offload of the chosen step."""
    layout = ev.layout
    dist, train = recipe.distributed, recipe.train
    reasons: dict[str, Choice] = {}
    reasons["micro_batch_size"] = Choice(ev.micro_batch, _micro_reason(train, ev))
    reasons["gradient_accumulation"] = Choice(
        ev.accumulation, f"global batch {train.global_batch_size} / (micro batch {ev.micro_batch} x "
                         f"{layout.data_parallel} data-parallel rank(s))")
    reasons["gradient_checkpointing"] = Choice(ev.checkpointing, _ckpt_reason(train, ev))
    reasons["zero_stage"] = Choice(layout.zero_stage, "recipe pins it" if dist.zero_stage != "auto" else
                                   ("from the preset" if layout.zero_stage is not None else "not DeepSpeed"))
    reasons["offload"] = Choice(layout.offload, "recipe pins it" if dist.offload != "auto" else
                                ("needed: nothing fits on the GPUs alone" if layout.offload != "none"
                                 else "not needed"))
    if train.qat is not None:
        reasons["qat"] = Choice(train.qat.scheme, f"recipe sets train.qat: torchao fake-quantizes the linear layers "
                                f"(int4 groups of {train.qat.group_size}) while training; final/ holds plain weights "
                                f"for `recipeforge export --format {qat_export_format(train.qat.scheme)}`")
    return reasons


def _memory_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, limit_gb: float) -> dict[str, Choice]:
    """The peak against its limit and, on GPUs, how accurate that peak is expected to be."""
    layout = ev.layout
    device = hw.device
    reasons: dict[str, Choice] = {}
    capacity = hw.gpu_memory_gb if device == "cuda" else hw.host_ram_gb()[0]
    reasons["memory"] = Choice(round(ev.memory.total / GIB, 2),
                               f"peak per {'GPU' if device == 'cuda' else 'process'}, limit {limit_gb:.1f} GB "
                               f"({recipe.distributed.memory_headroom:.0%} of {capacity:.1f} GB)")
    if device == "cuda":
        band = accuracy_band(w, layout)
        levers = sensitivity(w, layout, ev.micro_batch, ev.checkpointing, ev.accumulation,
                             hw.gpu_memory_gb * GIB, ev.memory)
        reasons["memory_accuracy"] = Choice(
            f"±{band:.0%}", "expected accuracy of the peak (calibrated against published measurements; it "
                            "counts the CUDA context and the allocator's reserve, as nvidia-smi does)"
                            + ("; most sensitive to: " + "; ".join(levers) if levers else ""))
    return reasons


def _plan_warnings(w: Workload, hw: Hardware, ev: Evaluation, decision: Decision) -> list[str]:
    warnings = list(decision.warnings)
    if ev.layout.offload != "none":
        ram, known = hw.host_ram_gb()
        if not known:
            warnings.append(f"host RAM of the target is unknown; offload assumes {ram:.0f} GB per node and needs "
                            f"{ev.memory.cpu_per_node / GIB:.0f} GB")
    warnings.extend(w.notes)
    warnings.extend(ev.memory.notes)
    return warnings


def _plan_extras(w: Workload, hw: Hardware, ev: Evaluation, decision: Decision, spec: PlannerSpec, model_source: str,
                 limit_gb: float, terms: str) -> PlanExtras:
    return PlanExtras(
        hardware=hw.to_dict(),
        model={**w.model.summary(), "source": model_source, "trainable_params": w.trainable_params(),
               "decoder_layer_class": w.model.decoder_layer_class,
               "vision_block_class": w.model.vision.block_class if w.model.vision is not None else None},
        dtype=w.dtype,
        precision=_precision(spec, w),
        attention=w.attention,
        sequence_len=w.seq_len,
        memory_limit_gb=round(limit_gb, 2),
        cpu_memory_gb=round(ev.memory.cpu_per_node / GIB, 1),
        runners_up=_runners_up(ev, decision),
        warnings=_plan_warnings(w, hw, ev, decision),
        context_parallel=ev.layout.context_parallel,
        activations=terms,
        accuracy_class=band_class(w, ev.layout),
        vision=vision_summary(w, ev.micro_batch, ev.checkpointing),
        teacher=teacher_summary(w, ev.memory.gb()),
    )


def _backend_reason(ev: Evaluation, decision: Decision, pins: list[str], limit_gb: float) -> str:
    if pins:
        figures = _fit(ev, limit_gb)
        return f"recipe pins {', '.join(pins)}; " + (figures if "tight" in figures else f"fits in {figures}")
    earlier = [e for e in decision.evaluations[: _position(decision, ev)] if not e.fits]
    lost = "; ".join(f"{e.layout.label} {e.problem}" for e in earlier[:3])
    head = f"first layout in preference order that fits ({_fit(ev, limit_gb)})"
    return f"{head}; before it: {lost}" if lost else head


def _fit(ev: Evaluation, limit_gb: float) -> str:
    """How the chosen layout fits: within the usable memory, or (a tight fit) only within the
    estimate's accuracy band, above the margin `distributed.memory_headroom` keeps."""
    total = ev.memory.total / GIB
    if total <= limit_gb:
        return f"{total:.1f} of {limit_gb:.1f} GB"
    return f"a tight fit: {total:.1f} GB estimated, {limit_gb:.1f} GB usable with the margin; see the warning"


def _position(decision: Decision, ev: Evaluation) -> int:
    return next(i for i, e in enumerate(decision.evaluations) if e is ev)


def _micro_reason(train: TrainConfig, ev: Evaluation) -> str:
    if isinstance(train.micro_batch_size, int):
        return "recipe sets it"
    bigger = [t for t in ev.tried if t[0] > ev.micro_batch and t[1] == ev.checkpointing]
    per_rank = train.global_batch_size // ev.layout.data_parallel
    why = f"auto: largest divisor of the per-rank batch {per_rank} (at most 8) that fits"
    if bigger:
        micro, _, need = min(bigger, key=lambda t: t[0])
        why += f"; {micro} would need {need / GIB:.1f} GB"
    return why


def _ckpt_reason(train: TrainConfig, ev: Evaluation) -> str:
    if train.gradient_checkpointing == "selective":
        return "recipe sets it: selective (matmul and attention outputs kept, the rest recomputed)"
    if isinstance(train.gradient_checkpointing, bool):
        return "recipe sets it" + (f": every {train.checkpoint_every}th layer" if train.checkpoint_every > 1 else "")
    if not ev.checkpointing:
        return "auto: off, the step fits without recomputation"
    without = [t for t in ev.tried if not t[1]]
    need = min(t[2] for t in without) if without else 0
    return f"auto: on, without it even micro batch 1 needs {need / GIB:.1f} GB"


def _precision(spec: PlannerSpec, w: Workload) -> str:
    if w.dtype == "fp32":
        return "fp32 weights, gradients and optimizer states"
    if w.adapter != "none":
        base = w.dtype if w.adapter != "qlora" else ("4-bit NF4" if w.quant_bits == 4 else "8-bit")
        return f"frozen {base} base weights; fp32 adapter weights, gradients and optimizer states; {w.dtype} compute"
    return spec.precision(w)


def _runners_up(ev: Evaluation, decision: Decision) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    chosen_index = _position(decision, ev)
    for i, e in enumerate(decision.evaluations):
        if e is ev:
            continue
        if not e.fits:
            why = e.problem
        elif i < chosen_index:
            why = f"fits, but {e.layout.backend} is not installed ({install_hint(e.layout.capabilities)})" \
                if not policy.backend_installed(e.layout.capabilities) else "fits"
        else:
            why = f"fits, but comes later in preference order than {ev.layout.label}"
        out.append({"backend": e.layout.backend, "preset": e.layout.preset, "fits": e.fits,
                    "memory_gb": round(e.memory.total / GIB, 2), "why": why, "label": e.layout.label})
    return out
