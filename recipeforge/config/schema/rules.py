"""Cross-field rules: combinations of individually valid settings that cannot work together.

Each rule takes a built `Recipe` (every section already valid on its own) and yields a
`RuleProblem` naming the key to change and how. `config.validate` runs them after pydantic built the
recipe and reports all violations at once, each at its own key.
"""

from __future__ import annotations

from typing import Iterator

from recipeforge.config.schema.components import COMPONENT_RULES
from recipeforge.config.schema.in_backward_rules import in_backward_problems
from recipeforge.config.schema.problems import RuleProblem
from recipeforge.config.schema.recipe import Recipe
from recipeforge.stage_specs import Stage, rl_section, stage_spec, stages_with


def check_rules(recipe: Recipe) -> list[RuleProblem]:
    """Every cross-field problem of `recipe` (empty when consistent)."""
    # Components (formats, kernels, rollout engines, rewards) are checked against their registries,
    # and plugin options against the plugins' own schemas, in `components`.
    out: list[RuleProblem] = []
    for rule in (*CORE_RULES, *COMPONENT_RULES):
        out.extend(rule(recipe))
    return out


def _data(r: Recipe) -> Iterator[RuleProblem]:
    if isinstance(r.data.val_size, float) and r.data.val_size >= 1:
        yield RuleProblem(("data", "val_size"), f"a share must be below 1 (got {r.data.val_size})",
                          "use 0 < x < 1 for a share, or a whole number of rows")
    if r.data.val_size and r.data.eval_datasets:
        yield RuleProblem(("data", "val_size"), "set either val_size or eval_datasets, not both",
                          "drop one of them")
    yield from _streaming(r)


def _streaming(r: Recipe) -> Iterator[RuleProblem]:
    """`data.streaming` and the settings that need (or cannot have) a corpus read whole."""
    d = r.data
    if not d.streaming:
        for key in ("stream_log", "stream_window"):
            if getattr(d, key) != type(d).model_fields[key].default:  # a written copy holds the defaults
                yield RuleProblem(("data", key), f"data.{key} has no effect without data.streaming: true",
                                  f"set data.streaming: true, or drop data.{key}")
        return
    if not stage_spec(r.stage).streams:
        yield RuleProblem(("data", "streaming"), f"stage {r.stage} reads its rows whole (its trainer tokenizes them); "
                          f"streaming is for {' and '.join(stages_with('streams'))}", "set data.streaming: false")
    if r.train.max_steps is None:
        yield RuleProblem(("train", "max_steps"), "a streamed corpus has no length to count epochs in: training "
                          "needs train.max_steps", "set train.max_steps (the stream starts over when it runs out)")
    if d.val_size:
        yield RuleProblem(("data", "val_size"), "rows cannot be held out of a stream for evaluation",
                          "use data.eval_datasets for evaluation data, or set data.val_size: 0")
    if d.dedup or any(s.dedup for s in d.datasets):
        key = ("data", "dedup") if d.dedup else ("data", "datasets", next(i for i, s in enumerate(d.datasets) if s.dedup),
                                                  "dedup")
        yield RuleProblem(key, "dropping duplicates needs every row seen before, which a stream does not keep",
                          "deduplicate the corpus beforehand, or set data.streaming: false")


def _adapter(r: Recipe) -> Iterator[RuleProblem]:
    a = r.adapter
    if a.type == "qlora" and r.model.dtype == "fp32":
        yield RuleProblem(("model", "dtype"), "QLoRA computes in bf16 or fp16 on its 4-bit base; fp32 is not supported",
                          "set model.dtype: bf16 (or auto)")
    if a.type == "none" and r.output.merge_adapter:
        yield RuleProblem(("output", "merge_adapter"), "there is no adapter to merge (adapter.type is none)",
                          "set adapter.type: lora, or merge_adapter: false")


def _train(r: Recipe) -> Iterator[RuleProblem]:
    t = r.train
    if t.max_steps is None and t.epochs is None:
        yield RuleProblem(("train", "epochs"), "set train.epochs or train.max_steps", "e.g. train.epochs: 1")
    if isinstance(t.micro_batch_size, int) and t.micro_batch_size > t.global_batch_size:
        yield RuleProblem(("train", "micro_batch_size"),
                          f"micro batch ({t.micro_batch_size}) is larger than the global batch ({t.global_batch_size})",
                          "lower micro_batch_size or raise global_batch_size")
    if t.load_best_model_at_end and not (r.data.val_size or r.data.eval_datasets):
        yield RuleProblem(("train", "load_best_model_at_end"), "choosing the best checkpoint needs evaluation data",
                          "set data.val_size or data.eval_datasets")


def _qat(r: Recipe) -> Iterator[RuleProblem]:
    """`train.qat` fake-quantizes the full weights that train and are exported; an adapter run has none."""
    if r.train.qat is None or r.adapter.type == "none":
        return
    if r.adapter.type == "qlora":
        why = ("a QLoRA base is already 4-bit (bitsandbytes): there are no full-precision weights to "
               "fake-quantize, and the int4 export quantizes the merged full weights instead")
    else:
        why = ("with LoRA the base stays frozen and the int4 export quantizes the merged weights (base + "
               "adapter), which fake-quantizing the base alone does not simulate")
    yield RuleProblem(("train", "qat"), f"quantization-aware training needs full fine-tuning: {why}",
                      "set adapter.type: none, or drop train.qat")


def _fp8(r: Recipe) -> Iterator[RuleProblem]:
    """`train.precision: fp8` converts the full model's linear layers; torchao's float8 training does not
    compose with adapters, fake quantization or 16/32-bit compute other than bf16."""
    t = r.train
    if t.precision != "fp8":
        if t.fp8 is not None:
            yield RuleProblem(("train", "fp8"), f"train.fp8 sets up fp8 training, and train.precision is "
                                                f"{t.precision}", "set train.precision: fp8, or drop train.fp8")
        return
    if r.adapter.type != "none":
        yield RuleProblem(("train", "precision"), f"fp8 training converts the trained linear layers to torchao's "
                          f"Float8Linear, and with {r.adapter.type} the base layers are frozen (peft wraps them; "
                          f"torchao's float8 training is for full training, as torchtitan and Axolotl use it)",
                          "set adapter.type: none, or train.precision: auto")
    elif t.qat is not None:
        yield RuleProblem(("train", "precision"), "fp8 training and train.qat both replace the linear layers "
                          "(Float8Linear, FakeQuantizedLinear); one layer cannot be both",
                          "drop train.qat, or set train.precision: auto")
    elif r.model.dtype in ("fp32", "fp16"):
        yield RuleProblem(("train", "precision"), f"fp8 training keeps bf16 compute outside the float8 matmuls, "
                          f"and model.dtype is {r.model.dtype}", "set model.dtype: bf16 (or auto)")


def distill_problems(r: Recipe) -> Iterator[RuleProblem]:
    """`stage: distill`: settings a teacher or the student's sampling cannot work with. QAT and fp8 train the
    student's linear layers as for SFT (the teacher is loaded apart and never converted), so they compose
    with off-policy distillation."""
    d = getattr(r, "distill", None)
    if r.stage != Stage.DISTILL or d is None:
        return
    if d.on_policy > 0 and r.data.packing:
        yield RuleProblem(("distill", "on_policy"), "on-policy steps sample a completion after each row's prompt, "
                          "and packed rows hold several prompts in one sequence", "set data.packing: false")
    if d.on_policy > 0 and r.train.precision == "fp8":
        yield RuleProblem(("distill", "on_policy"), "on-policy steps decode with the student, one token per row at "
                          "a time, and fp8 training's float8 matmuls need token counts in multiples of 16",
                          "set distill.on_policy: 0, or train.precision: auto")
    if d.teacher.url is not None and d.temperature != 1:
        yield RuleProblem(("distill", "temperature"), "a served teacher returns its log-probs at temperature 1; "
                          "they cannot be rescaled from its top-k alone", "set distill.temperature: 1, or use a "
                          "colocated teacher (distill.teacher.name_or_path)")
    if d.teacher.load_in_4bit and _target_device(r) == "cpu":
        yield RuleProblem(("distill", "teacher", "load_in_4bit"), "a 4-bit teacher needs bitsandbytes on a CUDA GPU, "
                          "and this recipe plans for a CPU", "set distill.teacher.load_in_4bit: false")
    yield from _teacher_tokenizer(r)


def _teacher_tokenizer(r: Recipe) -> Iterator[RuleProblem]:
    """A local student tokenizer and a local colocated teacher: their vocabularies, read from the files,
    must be the same (any other pair is compared with the loaded tokenizers before the first step)."""
    from pathlib import Path

    from recipeforge.components.vocab_files import first_difference, read_vocab

    teacher = r.distill.teacher.name_or_path  # type: ignore[attr-defined]  # a DistillRecipe
    student = r.model.tokenizer or r.model.name_or_path
    if teacher is None or not Path(teacher).expanduser().is_dir() or not Path(student).expanduser().is_dir():
        return
    theirs, ours = read_vocab(teacher), read_vocab(student)
    difference = first_difference(ours, theirs) if ours is not None and theirs is not None else None
    if difference is not None:
        yield RuleProblem(("distill", "teacher", "name_or_path"), f"the teacher's tokenizer differs from the "
                          f"student's ({student}): {difference}", "distill from a teacher with the student's "
                          "tokenizer (the divergence compares the same token ids)")


def _target_device(r: Recipe) -> str | None:
    """cuda or cpu when the recipe's `hardware:` section says so (else known only when planning)."""
    if r.hardware is None:
        return None
    return "cpu" if r.hardware.gpus_per_node == 0 else "cuda"


def _parallel_sizes(r: Recipe, backend: str) -> list:
    """Pinned FSDP2 mesh sizes the recipe alone rules out (the planner checks them against the model
    and the GPUs): replicate/shard sizes off FSDP, a sequence that does not split 2 x cp ways."""
    from recipeforge.capabilities import Refusal, all_capabilities
    from recipeforge.config.schema.parallel_rules import context_parallel_refusal, expert_parallel_refusals

    d, out = r.distributed, []
    every = all_capabilities()
    for key in ("data_parallel_replicate", "data_parallel_shard"):
        meshes = [name for name, caps in every.items() if key in caps.parallel_sizes]
        if (d.pinned_size(key) or 1) > 1 and backend != "auto" and backend not in meshes:
            out.append(Refusal(f"distributed.{key}", f"{key} sizes a device mesh ({' or '.join(meshes)}: "
                               f"accelerate's ParallelismConfig), not the {backend} backend",
                               f"set distributed.backend: {meshes[0] if meshes else 'auto'}"))
    out += expert_parallel_refusals(r, backend, every)
    cp = d.pinned_size("context_parallel") or 1
    why = context_parallel_refusal(cp, seq_len=r.data.sequence_len, model_type="", attention=r.model.attn_implementation,
                                   packing=bool(r.data.packing))
    if why is not None:
        out.append(Refusal(why.key, why.message, why.hint))
    return out


def _distributed(r: Recipe) -> Iterator[RuleProblem]:
    """The pinned backend against its capability record (`recipeforge.capabilities`), the record the
    planner and the backend's `check()` read too; `auto` needs at least one backend that runs it."""
    from recipeforge.capabilities import Refusal, all_capabilities, capabilities_of, find_preset, parallel_key, refusals
    from recipeforge.registry import registry_for

    d, a = r.distributed, r.adapter
    backend, zero, offload = d.backend, d.zero_stage, d.offload
    if backend != "auto" and not registry_for("backends").has(backend):
        return  # an unknown backend name is reported with the other names (`components`)
    pinned = find_preset(d.preset) if d.preset else None
    if pinned is not None and backend in ("auto", pinned.backend):  # a preset stands for its backend's settings
        backend, offload = pinned.backend, pinned.offload
        zero = pinned.zero_stage if pinned.zero_stage is not None else zero
    facts = dict(stage=r.stage, device=_target_device(r), adapter=a.type, quant_bits=a.quant.bits,
                 offload=offload, zero_stage=zero, optimizer=r.train.optimizer,
                 model_parallel=parallel_key(d.tensor_parallel, d.pipeline_parallel, d.context_parallel))
    if backend != "auto":
        found = refusals(capabilities_of(backend), **facts)
    else:
        every = {name: refusals(caps, **facts) for name, caps in all_capabilities().items()}
        if all(every.values()):
            # No backend runs it: report the first backend's reasons (the others' are alternatives)
            keys = [f[0].key for f in every.values()]
            key = max(keys, key=keys.count)
            why = "; ".join(f"{name}: {f[0].message}" for name, f in every.items() if f[0].key == key)
            found = [Refusal(key, f"no backend runs this combination ({why})", "change this setting")]
        else:
            found = []
    found += _parallel_sizes(r, backend)
    seen = set()
    for refusal in found:
        if refusal.key not in seen:  # one problem per key: the first reason is the one to fix
            seen.add(refusal.key)
            yield RuleProblem(tuple(refusal.key.split(".")), refusal.message, refusal.hint)
    if backend != "auto":
        # Recipe settings the backend cannot honour beyond its record (Megatron: its field table).
        for key, message in registry_for("backends").get(backend).recipe_refusals(r):
            if key not in seen:
                seen.add(key)
                prefix = f"{key}: "
                yield RuleProblem(tuple(key.split(".")), message[len(prefix):] if message.startswith(prefix) else message,
                                  "use another backend (distributed.backend: auto), or drop this setting")


def _stage_specific(r: Recipe) -> Iterator[RuleProblem]:
    spec = stage_spec(r.stage)
    least, t = spec.min_micro_batch, r.train
    if isinstance(t.micro_batch_size, int) and t.micro_batch_size < least:
        yield RuleProblem(("train", "micro_batch_size"),
                          f"{spec.needs_rows}; the recipe sets {t.micro_batch_size}",
                          f"set train.micro_batch_size: {least} or more (a divisor of the per-GPU batch), or auto")
    elif t.global_batch_size < least:
        yield RuleProblem(("train", "global_batch_size"),
                          f"{spec.needs_rows}; a global batch of {t.global_batch_size} has fewer",
                          f"set train.global_batch_size: {least} or more")
    rl = rl_section(r)
    if rl is not None:
        name, g = rl
        if r.train.global_batch_size % g.num_generations:
            yield RuleProblem(("train", "global_batch_size"),
                              f"{name.upper()} needs a global batch divisible by {name}.num_generations "
                              f"({r.train.global_batch_size} % {g.num_generations} != 0)",
                              f"use a multiple of {g.num_generations}, e.g. {g.num_generations * max(1, r.train.global_batch_size // g.num_generations)}")


def _rendezvous(r: Recipe) -> Iterator[RuleProblem]:
    """The elastic launch keys: etcd always, and c10d across machines, need the endpoint every node
    meets at (no node can guess it: a c10d store has no fixed host, an etcd server is external)."""
    d = r.distributed
    nodes = r.hardware.nodes if r.hardware is not None else 1
    if d.rdzv_endpoint is None and (d.rdzv_backend == "etcd" or (d.rdzv_backend == "c10d" and nodes > 1)):
        where = "an etcd server" if d.rdzv_backend == "etcd" else f"a c10d store shared by the {nodes} nodes"
        yield RuleProblem(("distributed", "rdzv_backend"), f"rdzv_backend {d.rdzv_backend} needs {where}, and "
                          "distributed.rdzv_endpoint is unset",
                          "set distributed.rdzv_endpoint: host:port (e.g. ${env:MASTER_ADDR}:29400), or use "
                          "rdzv_backend: static")
    if d.rdzv_endpoint is not None and not _host_port(d.rdzv_endpoint):
        yield RuleProblem(("distributed", "rdzv_endpoint"), f"'{d.rdzv_endpoint}' is not host:port",
                          "e.g. node001:29400")


def _ray(r: Recipe) -> Iterator[RuleProblem]:
    """`launcher: ray`: Ray places the workers and hosts their rendezvous, so torchrun's rendezvous keys
    have nothing to set; `ray_address` is read by the Ray launcher only, and names a cluster."""
    from recipeforge.capabilities import Launcher

    d = r.distributed
    if d.launcher != Launcher.RAY:
        if d.ray_address is not None:
            yield RuleProblem(("distributed", "ray_address"), "is read only with distributed.launcher: ray",
                              "set distributed.launcher: ray (or run `recipeforge launch --ray`), or drop ray_address")
        return
    for key, value, default in (("rdzv_backend", d.rdzv_backend, "static"), ("rdzv_endpoint", d.rdzv_endpoint, None),
                                ("rdzv_id", d.rdzv_id, None)):
        if value != default:
            yield RuleProblem(("distributed", key), "has no effect with launcher: ray (Ray Train places the workers "
                              "and sets up their process group)", f"drop distributed.{key}")
    if d.ray_address is not None and not ray_address_ok(d.ray_address):
        yield RuleProblem(("distributed", "ray_address"), f"'{d.ray_address}' is not a Ray cluster address",
                          "host:port of the head node (e.g. 10.0.0.1:6379), ray://host:10001, or auto")


def ray_address_ok(text: str) -> bool:
    """Whether `text` reads as a Ray address: `auto`, `host:port`, or `ray://host[:port]`."""
    text = text.strip()
    if text == "auto":
        return True
    if text.startswith("ray://"):
        return _host_port(text[len("ray://"):])
    return ":" in text and _host_port(text)


def _host_port(text: str) -> bool:
    """Whether `text` reads as host[:port] (torchrun's rendezvous endpoint; its default port is 29400)."""
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        return bool(port) and " " not in port
    return bool(host) and port.isdecimal() and 0 < int(port) < 65536


CORE_RULES = (_data, _adapter, _train, _qat, _fp8, _distributed, _rendezvous, _ray, _stage_specific,
              distill_problems, in_backward_problems)
