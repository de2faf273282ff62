"""Reserved against allocated memory of real training steps, at real model sizes, on a CPU.

Each case builds the real transformers model of a real config under `FakeTensorMode` (no data),
records every storage the steps allocate and free, in program order, and replays that trace
through the CUDA caching allocator's rules (`recipeforge.plan.caching_allocator`). Three optimizer
steps run as the Trainer runs them (forward under bf16 autocast and backward for each micro batch,
gradient clipping, AdamW, `zero_grad(set_to_none=True)`); the peaks are reset after the first, as a run's logged peaks are
taken once training is under way. Printed per case: the replay's peak allocated and reserved
memory and the gap between them, beside the planner's for the same recipe (its allocator reserve is
its gap) and the error of its reserved peak.

    python bench/allocator_replay.py                  # the real shapes (minutes on 2 cores)
    python bench/allocator_replay.py --small --json   # 2-layer shapes (seconds)

What a GPU adds that a CPU trace lacks: other streams (NCCL, FSDP's all-gather and reduce-scatter
streams keep blocks of their own), kernels' internal workspaces, and the CUDA context.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
GIB = 2 ** 30


@dataclass(frozen=True)
class Case:
    model: str
    method: str             # full | lora
    checkpointing: bool
    micro_batch: int
    sequence_len: int = 2048
    accumulation: int = 1   # micro batches per optimizer step

    @property
    def name(self) -> str:
        return (f"{self.model.split('/')[-1]} {self.method} b{self.micro_batch}x{self.sequence_len}"
                + (f" ga{self.accumulation}" if self.accumulation > 1 else "")
                + (" ckpt" if self.checkpointing else ""))


CASES = [
    # the GPU suite's full-1b (global batch 8: two micro batches of 4; measured on an H200: 49.70 GiB
    # allocated, 53.59 reserved)
    Case("meta-llama/Llama-3.2-1B", "full", False, 4, accumulation=2),
    Case("meta-llama/Llama-3.2-1B", "full", True, 4, accumulation=2),
    Case("meta-llama/Llama-3.2-1B", "full", False, 4),
    Case("meta-llama/Llama-3.1-8B", "lora", True, 1),
    Case("meta-llama/Llama-3.1-8B", "lora", True, 2),
    Case("meta-llama/Llama-3.1-8B", "lora", True, 4),
    Case("meta-llama/Llama-3.1-8B", "lora", False, 2),
    Case("meta-llama/Llama-2-7b-hf", "lora", True, 1),
    Case("meta-llama/Llama-2-7b-hf", "lora", True, 4),
    Case("meta-llama/Llama-2-7b-hf", "lora", True, 6),
    Case("meta-llama/Llama-2-7b-hf", "lora", True, 10),
]


@dataclass
class Result:
    case: str
    allocated_gib: float            # the replay's peaks
    reserved_gib: float
    planner_allocated_gib: float    # the planner's, for the same recipe
    planner_reserved_gib: float
    largest_request_gib: float
    seconds: float

    @property
    def gap_gib(self) -> float:
        return self.reserved_gib - self.allocated_gib

    @property
    def planner_reserve_gib(self) -> float:
        return self.planner_reserved_gib - self.planner_allocated_gib

    @property
    def reserved_error(self) -> float:
        return self.planner_reserved_gib / self.reserved_gib - 1


class TraceRecorder:
    """A dispatch mode that notes every new storage an op returns and, through a weak reference,
    when it is freed: ("alloc", id, nbytes) and ("free", id) events in program order."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.weak import WeakIdKeyDictionary

        recorder = self
        self.events: list[tuple] = []
        self._seen = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref] = {}
        self._next = 0

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder.note(out)
                return out

        self.mode = _Mode()

    def note(self, out) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t.untyped_storage())

    def add(self, storage) -> None:
        if storage in self._seen or storage.nbytes() == 0:
            return
        key, self._next = self._next, self._next + 1
        self._seen[storage] = key
        self._refs[key] = weakref.ref(storage, lambda _ref, key=key: self._freed(key))
        self.events.append(("alloc", key, storage.nbytes()))

    def add_existing(self, tensors) -> None:
        """Storages created before recording (the model's parameters), as allocations."""
        for t in tensors:
            self.add(t.untyped_storage())

    def _freed(self, key: int) -> None:
        self._refs.pop(key, None)
        self.events.append(("free", key))


def _config(model: str, layers: int | None):
    from plan_vs_tracker import _config as tracker_config

    return tracker_config(model, layers)


def trace_case(case: Case, layers: int | None) -> tuple[list[tuple], int]:
    """The allocation trace of three training steps of `case`, and its largest single request."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    config = _config(case.model, layers)
    recorder = TraceRecorder()
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if case.method == "lora"
                                                 else torch.float32)
        model.config.use_cache = False
        if case.method == "lora":
            from peft import LoraConfig, get_peft_model

            to = torch.nn.Module.to
            torch.nn.Module.to = lambda self, *args, **kwargs: self   # fake parameters cannot be moved
            try:
                model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                        target_modules="all-linear"))
            finally:
                torch.nn.Module.to = to
        if case.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if case.method == "lora":
                model.enable_input_require_grads()
        params = [p for p in model.parameters() if p.requires_grad]
        # foreach, as torch picks it for CUDA tensors (a CPU tensor would get the per-tensor loop)
        optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        ids = torch.randint(0, config.vocab_size, (case.micro_batch, case.sequence_len))
        recorder.add_existing(list(model.parameters()) + list(model.buffers()) + [ids])

        def step() -> None:
            for _ in range(case.accumulation):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                del loss
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)   # as the Trainer's model.zero_grad()

        with recorder.mode:
            step()
            recorder.events.append(("reset",))
            step()
            step()
    largest = max((e[2] for e in recorder.events if e[0] == "alloc"), default=0)
    return recorder.events, largest


def planner_peaks(case: Case, layers: int | None) -> tuple[float, float]:
    """The planner's allocated and reserved peaks for the case's recipe, in GiB (`measured_view`)."""
    import tempfile

    import yaml

    from recipeforge.config.pipeline import load_recipe
    from recipeforge.plan.hardware import parse_hardware
    from recipeforge.plan.memory import measured_view
    from recipeforge.plan.plan import make_plan

    model = {"name_or_path": case.model, "dtype": "bf16", "attn_implementation": "sdpa"}
    if layers is not None:
        from plan_vs_tracker import _small_config_dir

        model["name_or_path"] = _small_config_dir(case.model, layers)
    recipe = {"stage": "pretrain", "model": model,
              "data": {"datasets": [{"path": str(ROOT / "examples" / "data" / "pretrain.jsonl"), "format": "text"}],
                       "sequence_len": case.sequence_len, "packing": True},
              "train": {"global_batch_size": case.micro_batch * case.accumulation, "micro_batch_size": case.micro_batch,
                        "gradient_checkpointing": case.checkpointing, "optimizer": "adamw"},
              "distributed": {"backend": "single"}}
    if case.method == "lora":
        recipe["adapter"] = {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(recipe, fh)
    plan = make_plan(load_recipe(fh.name).recipe, parse_hardware("1xMI300X-192GB"))
    return measured_view(plan.memory_gb, "allocated"), measured_view(plan.memory_gb, "reserved")


def run(cases: list[Case], layers: int | None) -> list[Result]:
    from recipeforge.plan.caching_allocator import replay

    out = []
    for case in cases:
        start = time.perf_counter()
        events, largest = trace_case(case, layers)
        stats = replay(events)
        allocated, reserved = planner_peaks(case, layers)
        out.append(Result(case.name, stats.peak_allocated / GIB, stats.peak_reserved / GIB, allocated, reserved,
                          largest / GIB, round(time.perf_counter() - start, 1)))
        print(f"  {case.name}: {out[-1].seconds} s", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="2-layer shapes of the same models (seconds)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cases", nargs="*", type=int, help="indices into the case list")
    args = parser.parse_args(argv)
    cases = [CASES[i] for i in args.cases] if args.cases else CASES
    results = run(cases, 2 if args.small else None)
    if args.json:
        print(json.dumps([asdict(r) | {"gap_gib": r.gap_gib, "planner_reserve_gib": r.planner_reserve_gib,
                                       "reserved_error": r.reserved_error} for r in results], indent=2))
        return 0
    print("GiB; replay: the trace through the allocator's rules; plan: recipeforge plan for the same recipe")
    print(f"{'case':<36} {'replay allocated':>16} {'reserved':>8} {'gap':>5}   {'plan allocated':>14} "
          f"{'reserved':>8} {'reserve':>7} {'error':>6}")
    for r in results:
        print(f"{r.case:<36} {r.allocated_gib:>16.2f} {r.reserved_gib:>8.2f} {r.gap_gib:>5.2f}   "
              f"{r.planner_allocated_gib:>14.2f} {r.planner_reserved_gib:>8.2f} {r.planner_reserve_gib:>7.2f} "
              f"{r.reserved_error:>+6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
