"""The planner's memory terms against torch's own accounting, at real model sizes, on a CPU.

Each case builds the real transformers model of a real config under `FakeTensorMode` (shapes and
dtypes, no data: an 8B model costs a few hundred MB of RAM), runs one untracked warm-up step (so the
optimizer states exist), then a tracked forward, backward and optimizer step under
`torch.distributed._tools.mem_tracker.MemTracker`, which files every tensor under a category:
parameters, gradients, optimizer states, activations and temporaries. The planner plans the same
recipe (`recipeforge.plan.make_plan`, same micro batch, sequence length, precision and checkpointing)
and its terms are compared term by term:

    weights        <-> Parameter             (fp32 master weights with bf16 autocast, as the Trainer keeps)
    gradients      <-> Gradient
    optimizer      <-> Optstate              (AdamW's two moments; its step counter is not a tensor term)
    train phase    <-> Activation + Temp at the step's peak (the planner's largest moment of forward and
                       backward: activations, logits, autocast copies, gradients in flight, gathered weights)

What the tracker cannot see stays the planner's own and is left out: the CUDA context and workspaces
(`runtime`), the allocator's reserve, NCCL buffers.

    python bench/plan_vs_tracker.py                       # the real shapes (a few minutes on 2 cores)
    python bench/plan_vs_tracker.py --small --json        # a 2-layer shape of each (the test uses it)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GIB = 2 ** 30
BAND = 0.05
DATA = ROOT / "examples" / "data" / "pretrain.jsonl"


@dataclass(frozen=True)
class Case:
    model: str
    method: str            # full | lora
    checkpointing: bool
    micro_batch: int = 1
    sequence_len: int = 2048
    world: int = 1         # > 1: FSDP2 (full sharding, bf16 compute) over this many ranks
    selective: bool = False  # with checkpointing: selective (train.gradient_checkpointing: selective)

    @property
    def name(self) -> str:
        ckpt = (" selective" if self.selective else " ckpt") if self.checkpointing else ""
        return (f"{self.model.split('/')[-1]} {self.method}{ckpt}"
                + (f" fsdp{self.world}" if self.world > 1 else ""))


@dataclass
class Result:
    case: str
    planner: dict = field(default_factory=dict)   # term -> GiB
    tracker: dict = field(default_factory=dict)   # term -> GiB
    seconds: float = 0.0

    def error(self, term: str) -> float | None:
        p, t = self.planner.get(term), self.tracker.get(term)
        if p is None:
            return None
        return None if not t or p is None else p / t - 1


CASES = [Case(m, method, ckpt) for m in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B")
         for method in ("full", "lora") for ckpt in (False, True)]
FSDP_CASES = [Case("meta-llama/Llama-3.1-70B", "full", True, world=8)]
# Selective activation checkpointing (`stages.checkpointing`, torchtitan's policy) on the same shapes.
SELECTIVE_CASES = [Case("meta-llama/Llama-3.1-8B", method, True, selective=True) for method in ("full", "lora")]
TERMS = ("weights", "gradients", "optimizer", "model_states", "train_phase")


def plan_terms(case: Case, layers: int | None) -> dict:
    """The planner's terms for the case, in GiB (one process, bf16 autocast over fp32 weights)."""
    import yaml

    from recipeforge.config.pipeline import load_recipe
    from recipeforge.plan.hardware import parse_hardware
    from recipeforge.plan.memory import TRAIN_PHASE
    from recipeforge.plan.plan import make_plan

    # The tracker's model runs sdpa over the recipe's packed rows (under FakeTensorMode transformers
    # always builds the packed-sequence mask): the recipe says sdpa, so the plan counts that mask.
    model = {"name_or_path": case.model, "dtype": "bf16", "attn_implementation": "sdpa"}
    recipe = {"stage": "pretrain", "model": model,
              "data": {"datasets": [{"path": str(DATA), "format": "text"}], "sequence_len": case.sequence_len,
                       "packing": True},
              "train": {"global_batch_size": case.micro_batch, "micro_batch_size": case.micro_batch,
                        "gradient_checkpointing": "selective" if case.selective else case.checkpointing,
                        "optimizer": "adamw"},
              "distributed": {"backend": "single"} if case.world == 1 else
              {"backend": "fsdp", "preset": "fsdp_full_shard", "offload": "none"}}
    if case.method == "lora":
        # No dropout: on a CPU, dropout keeps a full-width noise tensor for backward where CUDA's fused
        # kernel keeps a one-byte mask, so the tracker would count what a GPU run does not hold.
        recipe["adapter"] = {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
    if layers is not None:
        recipe["model"] = {**model, "name_or_path": _small_config_dir(case.model, layers)}
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(recipe, fh)
    recipe_obj = load_recipe(fh.name).recipe
    if case.world > 1:
        recipe_obj = recipe_obj.model_copy(update={"train": recipe_obj.train.model_copy(
            update={"global_batch_size": case.micro_batch * case.world})})
    # The largest accelerator of the table, so that every case plans (only the terms are compared).
    plan = make_plan(recipe_obj, parse_hardware(f"{case.world}xMI300X-192GB"))
    m = plan.memory_gb
    train = sum(m.get(k, 0.0) for k in TRAIN_PHASE)
    states = sum(m.get(k, 0.0) for k in ("weights", "gradients", "optimizer", "adapter"))
    if case.method == "lora":  # the adapter's weights, gradients and states are one term of the planner
        return {"model_states": states, "train_phase": train}
    return {"weights": m.get("weights", 0.0), "gradients": m.get("gradients", 0.0),
            "optimizer": m.get("optimizer", 0.0), "model_states": states, "train_phase": train}


def _config(model: str, layers: int | None):
    from transformers import AutoConfig

    from recipeforge.plan.catalog import KNOWN_CONFIGS, _known

    fields = dict(KNOWN_CONFIGS[_known(model)])
    if layers is not None:
        fields["num_hidden_layers"] = layers
    config = AutoConfig.for_model(**fields)
    config._attn_implementation = "sdpa"
    return config


def _small_config_dir(model: str, layers: int) -> str:
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="tracker-config-"))
    _config(model, layers).save_pretrained(out)
    return str(out)


def fsdp_tracker_terms(case: Case, layers: int | None) -> dict:
    """torch's accounting of one FSDP2 step on rank 0 of `case.world` ranks: a fake process group, the
    model sharded per decoder layer as Accelerate does (fp32 shards, bf16 gathered weights and reduced
    gradients), `FSDPMemTracker`, in GiB."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("fake", rank=0, world_size=case.world, store=FakeStore())
    try:
        return _fsdp_step_terms(case, layers, init_device_mesh("cpu", (case.world,)))  # mesh: a real tensor
    finally:
        if started:
            dist.destroy_process_group()


def _fsdp_step_terms(case: Case, layers: int | None, mesh) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    config = _config(case.model, layers)
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.config.use_cache = False
        if case.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        ids = torch.randint(0, config.vocab_size, (case.micro_batch, case.sequence_len))

        def step() -> None:
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

        step()
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
        with tracker:
            step()
        snap = tracker.get_tracker_snapshot("peak")
    cats = {getattr(k, "value", str(k)): v / GIB for k, v in next(iter(snap.values())).items()}
    return {"weights": cats.get("Sharded Param", 0.0), "gradients": cats.get("Sharded Grad", 0.0),
            "optimizer": cats.get("OptState", 0.0),
            "model_states": sum(cats.get(k, 0.0) for k in ("Sharded Param", "Sharded Grad", "OptState")),
            "train_phase": sum(cats.get(k, 0.0) for k in ("Unsharded Param", "Unsharded Grad", "Activation", "Temp",
                                                          "All Gather", "Reduce Scatter"))}


def tracker_terms(case: Case, layers: int | None) -> dict:
    """torch's accounting of one step of the case (fake tensors), in GiB."""
    if case.world > 1:
        return fsdp_tracker_terms(case, layers)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    config = _config(case.model, layers)
    with FakeTensorMode():
        # As the run loads it: fp32 weights under bf16 autocast for full fine-tuning, a bf16 frozen
        # base under fp32 adapters for LoRA.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if case.method == "lora"
                                                 else torch.float32)
        if case.method == "lora":
            from peft import LoraConfig, get_peft_model

            # peft moves each new adapter to its base layer's device with `.to()`, which cannot swap a
            # fake parameter; here every tensor is on the one (fake) CPU device in fp32 already.
            to = torch.nn.Module.to
            torch.nn.Module.to = lambda self, *args, **kwargs: self
            try:
                model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                        target_modules="all-linear"))
            finally:
                torch.nn.Module.to = to
        if case.checkpointing and case.selective:
            from recipeforge.stages.checkpointing import enable_checkpointing

            enable_checkpointing(model, selective=True)  # as the run enables it
        elif case.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads() if case.method == "lora" else None
        model.config.use_cache = False
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=False)
        ids = torch.randint(0, config.vocab_size, (case.micro_batch, case.sequence_len))

        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as with accumulation

        step()  # untracked warm-up: the optimizer's states now exist
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        # MemTracker hooks every parameter's gradient; a frozen one (LoRA's base) cannot take a hook
        # and has no gradient to count, so it is marked as hooked already.
        for p in model.parameters():
            if not p.requires_grad:
                tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        with tracker:
            step()
        snap = tracker.get_tracker_snapshot("peak")
    cats = next(iter(snap.values()))

    def gib(*names: str) -> float:  # categories are _MemRefType members: PARAM = "Parameter", ...
        return sum(v for k, v in cats.items() if getattr(k, "value", str(k)) in names) / GIB

    return {"weights": gib("Parameter"), "gradients": gib("Gradient"), "optimizer": gib("Optstate"),
            "model_states": gib("Parameter", "Gradient", "Optstate"), "train_phase": gib("Activation", "Temp")}


class _NoHook:
    def remove(self) -> None:
        pass


def run(cases: list[Case], layers: int | None) -> list[Result]:
    out = []
    for case in cases:
        start = time.perf_counter()
        result = Result(case.name, plan_terms(case, layers), tracker_terms(case, layers))
        result.seconds = round(time.perf_counter() - start, 1)
        out.append(result)
        print(f"  {case.name}: {result.seconds} s", file=sys.stderr, flush=True)
    return out


def table(results: list[Result]) -> str:
    head = "| case | " + " | ".join(f"{t} planner / tracker (GiB)" for t in TERMS) + " |"
    rows = [head, "|---" * (len(TERMS) + 1) + "|"]
    for r in results:
        cells = []
        for t in TERMS:
            e = r.error(t)
            mark = "" if e is None or abs(e) <= BAND else " (!)"
            if t not in r.planner:
                cells.append("(one term: model states)")
                continue
            cells.append(f"{r.planner[t]:.2f} / {r.tracker.get(t, 0):.2f} "
                         f"({'-' if e is None else f'{e:+.1%}'}){mark}")
        rows.append(f"| {r.case} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="2-layer shapes of the same models (seconds)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-fsdp", action="store_true", help="leave out the FSDP2 case (minutes at 70B)")
    args = parser.parse_args(argv)
    results = run(CASES + SELECTIVE_CASES + ([] if args.no_fsdp else FSDP_CASES), 2 if args.small else None)
    if args.json:
        print(json.dumps([asdict(r) | {"errors": {t: r.error(t) for t in TERMS}} for r in results], indent=2))
    else:
        print(table(results))
        worst = max(abs(e) for r in results for t in TERMS if (e := r.error(t)) is not None)
        print(f"\nworst tensor term: {worst:.1%} (band ±{BAND:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
