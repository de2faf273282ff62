"""Shared pieces of the GPU benchmarks: recipes for model shapes shipped in bench/gpu/models, synthetic
data, running `recipeforge plan`/`train` as a user would, and reading what a run measured.

Models are built with random weights from the shipped config.json files (`model.init: random`), with
the locally built tiny tokenizer (its ids are a subset of every model's vocabulary), so nothing is
downloaded: memory and speed depend on the shapes, not on the weights.

FLOP convention (for MFU): per trained token, 6 x N for the matrix multiplies of the forward and
backward passes, N the parameters that take part in matrix multiplies (all but the input
embedding), plus 12 x layers x hidden x sequence for attention scores and values (the full, not
causal, attention matrix, as PaLM's appendix B counts it). LoRA and QLoRA runs are counted with the
same 6 x N (the frozen weights still run forward and backward for the activations' gradients; the
strict count without weight gradients would be 4 x N), so their MFU compares with full fine-tuning.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "bench" / "gpu" / "models"
WORDS = ("the a cow dog cat duck sheep says moo woof meow quack what does is of and to in on with one two three "
         "four five six seven eight nine ten answer question count add plus equals color red blue green apple "
         "banana cherry grape lemon fruit water sun moon tree house car road city world day night").split()
# The sizes of the CPU smoke check of the harness itself (same code path, seconds per case; with
# SMOKE_ROWS rows of data and `smoke_global_batch`).
SMOKE_CONFIG = {"vocab_size": 2048, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 4096, "tie_word_embeddings": False}
# A mixture of experts at the smoke check's sizes: 8 experts of 2 per token, split evenly over 2 or 4 ranks.
SMOKE_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# Rows of each synthetic dataset under --smoke: several times what a smoke case reads (a few steps of
# a few 256-token sequences). The GPU sizes write thousands, which every CPU case would tokenize again.
SMOKE_ROWS = 400


def smoke_global_batch(global_batch: int, micro_batch: int | str, processes: int = 1) -> int:
    """The global batch of a case under --smoke: two micro batches per process, so each step still
    accumulates gradients (the GPU runs' path) with the fewest micro steps a CPU has to run. A micro
    batch the planner chooses ("auto") keeps the case's global batch."""
    if not isinstance(micro_batch, int):
        return global_batch
    return min(global_batch, 2 * micro_batch * processes)


def model_dir(name: str, smoke: bool, out: Path) -> Path:
    """The directory holding the config.json of model `name` (the smoke config under --smoke)."""
    if not smoke:
        return MODELS / name
    # The model's own config.json (special token ids, rope scaling and all) at the smoke check's sizes,
    # so the smoke check reads the same fields the GPU run reads.
    path = out / "smoke-models" / name
    path.mkdir(parents=True, exist_ok=True)
    config = {**json.loads((MODELS / name / "config.json").read_text()), **SMOKE_CONFIG}
    if "num_experts" in config:
        config.update(SMOKE_MOE)
    config.pop("head_dim", None)
    (path / "config.json").write_text(json.dumps(config))
    return path


def random_weights(model: Path, out: Path) -> Path:
    """A folder with random-init bf16 weights for the config in `model` and the tiny tokenizer, written once:
    a backend that converts a checkpoint before training (megatron) cannot start from model.init: random."""
    path = out / "weights" / model.name
    if not (path / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from recipeforge.components.tokenizer import load_tokenizer

        config = AutoConfig.from_pretrained(model)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
        load_tokenizer("tiny:llama").save_pretrained(path)
    return path


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """Alpaca rows with instruction/input/output lengths spread like real instruction data."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    return [{"instruction": text(4, 40), "input": text(0, 60) if rng.random() < 0.4 else "",
             "output": text(5, 300)} for _ in range(n)]


def preference_rows(n: int, seed: int = 0) -> list[dict]:
    """prompt/chosen/rejected rows: the chosen answer names the animal's sound, the rejected one does not.
    Prompts run from a few words to past a 1024-token sequence, so batches at the planned length occur (the
    planner plans a preference batch at `sequence_len`; shorter rows alone would measure the data, not it)."""
    rng = random.Random(seed)
    sounds = {"cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack"}
    rows = []
    for _ in range(n):
        animal = rng.choice(list(sounds))
        filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 1000)))
        rows.append({"prompt": f"What does the {animal} say? {filler}", "chosen": f"The {animal} says {sounds[animal]}.",
                     "rejected": f"The {animal} says {rng.choice([s for a, s in sounds.items() if a != animal])}."})
    return rows


def prompt_rows(n: int, seed: int = 0) -> list[dict]:
    """GRPO prompts with a numeric answer for the accuracy reward."""
    rng = random.Random(seed)
    return [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)}
            for a, b in ((rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n))]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base_recipe(model: Path, data: Path, *, stage: str = "sft", seq: int, steps: int, global_batch: int,
                micro_batch: int | str, checkpointing: bool | str, lr: float = 1e-4) -> dict[str, Any]:
    """A recipe training `model` (random init) on `data` for `steps` steps, logging every step."""
    fmt = {"sft": "alpaca", "distill": "alpaca", "dpo": "preference", "grpo": "prompt"}[stage]
    return {
        "stage": stage,
        "model": {"name_or_path": str(model), "init": "random", "tokenizer": "tiny:llama", "dtype": "bf16",
                  "attn_implementation": "sdpa"},
        "data": {"datasets": [{"path": str(data), "format": fmt}], "sequence_len": seq, "packing": stage in ("sft", "distill")},
        "train": {"max_steps": steps, "global_batch_size": global_batch, "micro_batch_size": micro_batch,
                  "learning_rate": lr, "warmup_ratio": 0.0, "scheduler": "constant", "logging_steps": 1,
                  "gradient_checkpointing": checkpointing,
                  "divergence": {"spike_factor": None}},
        "output": {"save_steps": 100000, "save_total_limit": 1},
        "logging": {"progress_bar": False},
    }


def merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged in, section by section."""
    out = json.loads(json.dumps(base))
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def write_recipe(path: Path, recipe: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def cli(*args: str, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    """`recipeforge ARGS` in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO)


def plan_json(recipe: Path, *extra: str) -> dict:
    """`recipeforge plan RECIPE --json` (this machine's hardware unless `extra` names other)."""
    proc = cli("plan", str(recipe), "--json", *extra, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"plan failed for {recipe}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


# A GPU case takes 60-110 s (bench/gpu/lease.sh): one that has not ended in 8 minutes hangs, and the
# lease's other cases are worth more. The CPU rehearsal of a case takes up to 3 minutes on two busy cores.
CASE_TIMEOUT_S = {"gpu": 480, "smoke": 900}
TIMED_OUT = 124  # the exit status `run_bounded` gives a command it stopped, as coreutils' `timeout` does


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """`cmd` in a session of its own, stopped with everything it started when `timeout` seconds pass.

    A case that hangs (a collective waiting on a peer, a lock left by a killed build) must cost its own
    minutes only: the suite records it (exit 124, the output so far plus a line saying so) and goes on
    to the next case. The whole process group is stopped, since the launcher's workers would otherwise
    keep the GPU and the CPUs for the cases after it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        err = (err or "") + f"\n[bench] stopped after {timeout:.0f} s (the case's time limit)\n"
        return subprocess.CompletedProcess(cmd, TIMED_OUT, out or "", err)


def train(recipe: Path, run_dir: Path, *extra: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, float]:
    """`recipeforge train RECIPE output.dir=RUN_DIR --overwrite`, and its wall time. The run's whole
    stderr is kept beside the run directory (RUN_DIR.stderr), which `prune` leaves alone; its processes
    run with `-X importtime`, whose lines (kept out of `proc.stderr`) say which of the repository's
    modules the case depends on (`ledger.deps_of`). RUN_DIR.started holds the launch's wall-clock
    time, from which `measured` counts the seconds to the first step."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_name(run_dir.name + ".started").write_text(f"{time.time():.3f}\n")
    start = time.perf_counter()
    # PYTHONPROFILEIMPORTTIME (= -X importtime) reaches the worker processes a launch starts too.
    proc = run_bounded([sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run_dir}",
                        "--overwrite", *extra], timeout=timeout, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    wall = time.perf_counter() - start
    lines = (proc.stderr or "").splitlines()
    # A worker's lines may carry a launcher's prefix ("[rank0]:").
    run_dir.with_name(run_dir.name + ".imports").write_text("\n".join(l for l in lines if "import time:" in l))
    proc.stderr = "\n".join(l for l in lines if "import time:" not in l)
    run_dir.with_name(run_dir.name + ".stderr").write_text(proc.stderr)
    return proc, wall


def case_deps(run_dir: Path, *extra: Path) -> dict[str, str]:
    """The files a measured case depends on (`ledger.deps_of`): the modules its run imported, the bench
    scripts and `extra` (the model's config.json)."""
    from ledger import deps_of

    imports = run_dir.with_name(run_dir.name + ".imports")
    bench = sorted(Path(__file__).resolve().parent.glob("*.py"))
    return deps_of(imports.read_text() if imports.is_file() else "", [*bench, *extra])


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".distcp")


def prune(run_dir: Path) -> int:
    """Delete the weight files of a measured run (base model, checkpoints, final), keeping its logs,
    plan and metrics: a suite of 8B runs would otherwise fill the machine's disk. Returns the bytes freed."""
    freed = 0
    for path in run_dir.rglob("*"):
        if path.is_file() and path.name.endswith(WEIGHT_SUFFIXES):
            freed += path.stat().st_size
            path.unlink()
    return freed


class Budget:
    """A wall-clock allowance for a series of cases: a case starts only while time is left (a GPU lent
    for minutes must come back with results, not with a run killed halfway)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def left(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline


def commit() -> str | None:
    """The git commit of the checkout being measured: $BENCH_COMMIT where the caller knows it (a copy of a
    working tree sent to a GPU machine may carry another repository's history), else git's HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip() or None


def records(run_dir: Path, split: str | None = None) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if split is None or r.get("split") == split]


def measured(run_dir: Path, *, seq: int, global_batch: int, skip: int = 3) -> dict[str, Any]:
    """What a finished run measured: seconds to build the model (`init_s`) and from the launch to the
    first logged step (`first_step_s`), first/last loss, peak memory, tokens/s and step time.

    Throughput is taken over the logged steps after the first `skip` (start-up, allocator warm-up
    and kernel autotuning are not steady state): the trained tokens of a step over the median time
    between two logs, so a step that also wrote a checkpoint (the last one writes the final weights
    and, on a random base, base_model/) does not count as training time. Packed rows are
    `sequence_len` wide; the padding share the run logs is removed.
    """
    train_rows = [r for r in records(run_dir, "train") if r.get("step") is not None]
    startup = [r for r in records(run_dir, "startup") if r.get("model_load_s") is not None]
    started = run_dir.with_name(run_dir.name + ".started")
    first_step_s = (round(train_rows[0]["time"] - float(started.read_text()), 1)
                    if train_rows and started.is_file() else None)
    losses = [r["loss"] for r in train_rows if r.get("loss") is not None]
    reserved = [r["memory/peak_reserved_gib"] for r in train_rows if "memory/peak_reserved_gib" in r]
    allocated = [r["memory/peak_allocated_gib"] for r in train_rows if "memory/peak_allocated_gib" in r]
    steady = train_rows[skip:] if len(train_rows) > skip + 1 else train_rows
    step_seconds, step_tokens = [], []
    for prev, cur in zip(steady, steady[1:]):
        steps = max(1, cur["step"] - prev["step"])
        step_seconds.append((cur["time"] - prev["time"]) / steps)
        step_tokens.append(global_batch * seq * (1.0 - cur.get("padding_share", 0.0)))
    step_s = statistics.median(step_seconds) if step_seconds else None
    return {"init_s": startup[0]["model_load_s"] if startup else None, "first_step_s": first_step_s,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "loss_fell": bool(losses) and losses[-1] < losses[0],
            "measured_reserved_gb": max(reserved) if reserved else None,
            "measured_allocated_gb": max(allocated) if allocated else None,
            "tokens_per_s": round(statistics.fmean(step_tokens) / step_s, 1) if step_s else None,
            "step_s": round(step_s, 4) if step_s else None}


def model_flops_per_token(config: dict, seq: int) -> float:
    """Training FLOPs per token in the convention of this module's docstring."""
    from recipeforge.plan.models import spec_from_config

    spec = spec_from_config(config, "bench")
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    # Compute follows the parameters a token passes through (MoE: the routed experts only).
    matmul_params = spec.active_params() - vocab * h  # the input embedding is a lookup, not a matmul
    if config.get("tie_word_embeddings"):
        matmul_params += vocab * h  # the tied head still multiplies
    return 6.0 * matmul_params + 12.0 * layers * h * seq


def gpu_info() -> dict[str, Any]:
    """The GPU's name and memory, and the dense bf16 peak the planner's accelerator table gives it."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": "cpu (smoke check: no GPU)", "peak_tflops": None}
    from recipeforge.plan.hardware import probe_local_hardware

    acc = probe_local_hardware().accelerator
    return {"gpu": torch.cuda.get_device_name(0),
            "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 1024 ** 3, 1),
            "accelerator": acc.name if acc else None, "peak_tflops": acc.peak_tflops if acc and acc.peak_tflops else None}


def versions() -> dict[str, str]:
    """Versions of the packages a run depends on (absent ones left out)."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "recipeforge_commit": commit() or "unknown"}
    for name in ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "deepspeed", "bitsandbytes",
                 "liger-kernel", "recipeforge"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def tail(text: str, n: int = 1500) -> str:
    return text[-n:] if text else ""
