"""Every GPU path once: train a short run per case and set the planner's estimate against the measured peak.

    python bench/gpu/suite.py --out DIR                      # every case on this machine's GPU
    python bench/gpu/suite.py --out DIR --cases full-1b lora-8b-ckpt
    python bench/gpu/suite.py --out DIR --smoke              # the harness itself on a CPU, tiny shapes

Each case is a recipe (random init from bench/gpu/models/*/config.json, see common.py) trained through
`recipeforge train` in its own process. Per case it records the plan (`recipeforge plan --json` on
this machine), the measured peaks (`torch.cuda.max_memory_reserved` / `max_memory_allocated` of the
training process, logged by the run), tokens/s, MFU and whether the loss fell, and writes
DIR/gpu-<date>.json and DIR/gpu-<date>.md. `--pytest` adds `pytest -m gpu` as a case. Cases that
need a package the machine lacks (liger-kernel, deepspeed, bitsandbytes) are recorded as skipped.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One benchmark run: a model shape, a stage and the recipe settings that differ from the base."""

    name: str
    model: str
    settings: dict = field(default_factory=dict)
    stage: str = "sft"
    seq: int = 4096
    global_batch: int = 8
    micro_batch: int | str = 1
    checkpointing: bool | str = True
    needs: tuple[str, ...] = ()       # importable packages the case needs
    note: str = ""
    weights: bool = False             # start from written random-init weights instead of model.init: random
    gpu_only: tuple[str, ...] = ()    # a recipe key refused on a CPU (fp8): smoke plans it for GPU_TARGET instead
    teacher: str | None = None        # distill: the colocated teacher's model (random-init weights, written once)
    processes: int = 1                # GPUs (processes) the case trains on: --nproc-per-node; a CPU smoke runs gloo


LORA = {"adapter": {"type": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"}}
# Megatron-Bridge converts a Hugging Face checkpoint before training: its cases start from random-init weights
# written once (`common.random_weights`), and the recipe settings Megatron refuses are left out.
MEGATRON = {"distributed": {"backend": "megatron"}}
QLORA = {"adapter": {"type": "qlora", "r": 16, "alpha": 32, "target_modules": "all-linear",
                     "quant": {"bits": 4, "quant_type": "nf4"}}}
CASES = [
    Case("full-1b", "llama-3.2-1b", seq=2048, micro_batch=4, checkpointing=False,
         note="full bf16 SFT; the planner chooses the precision (mixed when it fits)"),
    Case("distill-1b", "llama-3.2-1b", stage="distill", seq=2048, micro_batch=4, checkpointing=False,
         teacher="llama-3.2-1b", note="a colocated 1B teacher (random bf16 weights) beside a 1B student: the "
                                      "planner's teacher terms and the step's cost against SFT (full-1b)"),
    Case("fp8-1b", "llama-3.2-1b", {"train": {"precision": "fp8"}}, seq=2048, micro_batch=4, checkpointing=False,
         gpu_only=("train", "precision"),
         note="full-1b with float8 matmuls (torchao, tensorwise): tokens/s and loss against full-1b, its bf16 twin"),
    Case("lora-8b-ckpt", "llama-3.1-8b", LORA, micro_batch=2),
    Case("lora-8b-nockpt", "llama-3.1-8b", LORA, micro_batch=1, checkpointing=False),
    Case("qlora-8b-ckpt", "llama-3.1-8b", QLORA, micro_batch=2, needs=("bitsandbytes",)),
    Case("qlora-8b-nockpt", "llama-3.1-8b", QLORA, micro_batch=1, checkpointing=False, needs=("bitsandbytes",)),
    Case("lora-8b-ckpt-liger", "llama-3.1-8b", {**LORA, "kernels": {"liger": {}}}, micro_batch=2,
         needs=("liger_kernel",)),
    Case("lora-qwen7b-ckpt", "qwen2.5-7b", LORA, micro_batch=2),
    Case("fsdp2-1b", "llama-3.2-1b", {"distributed": {"backend": "fsdp"}}, seq=2048, micro_batch=4,
         note="FSDP2 through Accelerate on one process (the DTensor sharding code path)"),
    Case("zero2-1b", "llama-3.2-1b", {"distributed": {"backend": "deepspeed", "zero_stage": 2}}, seq=2048,
         micro_batch=4, needs=("deepspeed",)),
    Case("zero3-1b", "llama-3.2-1b", {"distributed": {"backend": "deepspeed", "zero_stage": 3}}, seq=2048,
         micro_batch=4, needs=("deepspeed",)),
    Case("zero3-offload-3b", "llama-3.2-3b",
         {"distributed": {"backend": "deepspeed", "zero_stage": 3, "offload": "optimizer"}}, seq=2048,
         micro_batch=2, needs=("deepspeed",)),
    Case("dpo-lora-3b", "llama-3.2-3b", LORA, stage="dpo", seq=1024, micro_batch=2, needs=("trl",)),
    Case("grpo-lora-1b", "llama-3.2-1b",
         {**LORA, "grpo": {"num_generations": 4, "max_completion_length": 64, "beta": 0.0,
                           "rewards": [{"name": "length", "args": {"target": 24, "unit": "chars"}}]}},
         stage="grpo", seq=512, global_batch=8, micro_batch=4, needs=("trl",),
         note="HF generate rollouts (vLLM has no small wheel for this machine)"),
    Case("moe-full-1b", "qwen3-moe-1b", {"distributed": {"backend": "fsdp"}}, seq=2048, micro_batch=2,
         note="a Qwen3-MoE shape (64 experts, 8 per token) fully fine-tuned on one GPU: every expert on the rank, "
              "grouped_mm experts; the reference of moe-ep2-1b"),
    Case("moe-ep2-1b", "qwen3-moe-1b", {"distributed": {"backend": "fsdp", "expert_parallel": 2}}, seq=2048,
         micro_batch=2, processes=2,
         note="moe-full-1b with expert parallel 2 on 2 GPUs: 32 experts per rank, tokens by NCCL all-to-all, "
              "FSDP2 over the rest (transformers' ep_size); needs 2 GPUs"),
    Case("megatron-sft-1b", "llama-3.2-1b", MEGATRON, seq=2048, needs=("megatron",), weights=True,
         note="Megatron-Bridge's loop (TP 1, PP 1); loss and memory in Megatron's own log, not the run's records"),
    Case("megatron-sft-lora-1b", "llama-3.2-1b", {**LORA, **MEGATRON}, seq=2048, needs=("megatron",),
         weights=True, note="Megatron-Bridge's LoRA; final/ is a PEFT adapter"),
]


def data_for(stage: str, out: Path, smoke: bool = False) -> Path:
    """The synthetic dataset of a stage (written once per output directory; `common.SMOKE_ROWS` rows
    under --smoke, in a file of its own so a GPU-sized one left in the directory is not read)."""
    path = out / "data" / (f"smoke-{stage}.jsonl" if smoke else f"{stage}.jsonl")
    if not path.exists():
        sizes = {"sft": 6000, "distill": 6000, "dpo": 2000, "grpo": 2000}
        n = common.SMOKE_ROWS if smoke else sizes[stage]
        rows = {"sft": common.synthetic_rows, "distill": common.synthetic_rows, "dpo": common.preference_rows,
                "grpo": common.prompt_rows}[stage](n)
        common.write_jsonl(path, rows)
    return path


def global_batch_of(case: Case, smoke: bool) -> int:
    """The case's global batch (under --smoke two micro batches per process: `common.smoke_global_batch`)."""
    if not smoke:
        return case.global_batch
    return common.smoke_global_batch(case.global_batch, case.micro_batch, case.processes)


def recipe_of(case: Case, out: Path, steps: int, smoke: bool) -> Path:
    model = common.model_dir(case.model, smoke, out)
    seq = min(case.seq, 256) if smoke else case.seq
    base = common.base_recipe(model, data_for(case.stage, out, smoke), stage=case.stage, seq=seq, steps=steps,
                              global_batch=global_batch_of(case, smoke), micro_batch=case.micro_batch,
                              checkpointing=case.checkpointing)
    if smoke:  # a CPU: fp32 compute, the planner plans this machine
        base["model"]["dtype"] = "auto"
    if case.weights:  # settings Megatron refuses: random init, an attention implementation, the spike watch
        base["model"] = {"name_or_path": str(common.random_weights(model, out)), "tokenizer": base["model"]["tokenizer"],
                         "dtype": base["model"]["dtype"]}
        base["train"].pop("divergence", None)
    if case.teacher is not None:
        teacher = common.random_weights(common.model_dir(case.teacher, smoke, out), out)
        base["distill"] = {"teacher": {"name_or_path": str(teacher)}}
    return common.write_recipe(out / "recipes" / f"{case.name}.yaml", common.merge(base, case.settings))


def run_case(case: Case, out: Path, steps: int, smoke: bool) -> dict:
    row = {"case": case.name, "model": case.model, "stage": case.stage, "note": case.note}
    missing = [p for p in case.needs if importlib.util.find_spec(p) is None]
    if missing:
        return {**row, "status": "skipped", "why": f"not installed: {', '.join(missing)}"}
    launch = ("--nproc-per-node", str(case.processes)) if case.processes > 1 else ()
    if launch and not smoke:
        import torch

        if torch.cuda.device_count() < case.processes:
            return {**row, "status": "skipped",
                    "why": f"needs {case.processes} GPUs, this machine has {torch.cuda.device_count()}"}
    recipe = recipe_of(case, out, steps, smoke)
    if smoke and case.gpu_only:
        return smoke_gpu_only(case, recipe, row)
    try:
        plan = common.plan_json(recipe, *launch)
    except RuntimeError as exc:
        return {**row, "status": "plan failed", "why": common.tail(str(exc))}
    from recipeforge.plan.memory import measured_view

    if launch:  # the experts each rank held, read from its model in the run (backends.expert_parallel)
        row["processes"] = case.processes
    row.update(backend=plan["backend"], adapter=case.settings.get("adapter", {}).get("type", "none"),
               precision=plan["extra"].get("precision"), micro_batch=plan["micro_batch_size"],
               gradient_checkpointing=plan["gradient_checkpointing"],
               plan_gb=round(measured_view(plan["memory_gb"], "reserved"), 2),
               plan_allocated_gb=round(measured_view(plan["memory_gb"], "allocated"), 2),
               plan_terms=plan["memory_gb"])
    run_dir = out / "runs" / case.name
    proc, wall = common.train(recipe, run_dir, *launch, timeout=common.CASE_TIMEOUT_S["smoke" if smoke else "gpu"])
    row["wall_s"] = round(wall, 1)
    if proc.returncode != 0:
        common.prune(run_dir)
        return {**row, "status": f"train failed (exit {proc.returncode})", "why": common.tail(proc.stderr, 3000),
                "deps": common.case_deps(run_dir, common.MODELS / case.model / "config.json")}
    seq = min(case.seq, 256) if smoke else case.seq
    got = common.measured(run_dir, seq=seq, global_batch=global_batch_of(case, smoke))
    held = sorted((run_dir / "expert_parallel").glob("rank*.json"))
    if held:
        row["experts_per_rank"] = [[layer["experts"] for layer in json.loads(p.read_text())["layers"]][0]
                                   for p in held]
    common.prune(run_dir)
    row.update(got, status="ok", deps=common.case_deps(run_dir, common.MODELS / case.model / "config.json"))
    if got["measured_reserved_gb"] and row["plan_gb"]:
        row["plan_error"] = round(row["plan_gb"] / got["measured_reserved_gb"] - 1.0, 3)
    peak = common.gpu_info().get("peak_tflops")
    if peak and got["tokens_per_s"] and case.stage == "sft":
        config = json.loads((common.model_dir(case.model, smoke, out) / "config.json").read_text())
        flops = common.model_flops_per_token(config, seq) * got["tokens_per_s"]
        row["mfu"] = round(flops / (peak * 1e12), 4)
    return row


GPU_TARGET = "1xH100-80GB"


def smoke_gpu_only(case: Case, recipe: Path, row: dict) -> dict:
    """A GPU-only case on a CPU (`--smoke`): the recipe plans for GPU_TARGET with the key set, and this
    CPU refuses it at that key (exit 2), so the harness and the recipe are checked without training."""
    key = ".".join(case.gpu_only)
    try:
        plan = common.plan_json(recipe, "--hardware", GPU_TARGET)
    except RuntimeError as exc:
        return {**row, "status": "plan failed", "why": common.tail(str(exc))}
    refused = common.cli("plan", str(recipe), "--hardware", "cpu", timeout=300)
    if refused.returncode != 2 or key not in refused.stderr:
        return {**row, "status": f"not refused on the CPU (exit {refused.returncode})",
                "why": common.tail(refused.stderr)}
    from recipeforge.plan.memory import measured_view

    out = recipe.parent.parent  # recipes are written to OUT/recipes/
    return {**row, "status": "ok", "backend": plan["backend"], "precision": plan["extra"].get("precision"),
            "plan_gb": round(measured_view(plan["memory_gb"], "reserved"), 2),
            "deps": common.case_deps(out / "runs" / case.name, common.MODELS / case.model / "config.json"),
            "why": f"smoke: planned for {GPU_TARGET}; the CPU refuses {key} (GPU-only)"}


def run_pytest_gpu(out: Path) -> dict:
    """`pytest -m gpu` over the whole test suite, as a case of its own."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts="], capture_output=True, text=True, cwd=common.REPO, timeout=3000)
    (out / "pytest-gpu.txt").write_text(proc.stdout + proc.stderr)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return {"case": "pytest -m gpu", "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}",
            "summary": last}


def write_results(results: Path, date: str, result: dict) -> None:
    """The JSON and Markdown of the cases so far, each written whole then moved into place."""
    for name, text in ((f"gpu-{date}.json", json.dumps(result, indent=2)), (f"gpu-{date}.md", markdown(result))):
        tmp = results / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(results / name)


def markdown(result: dict) -> str:
    lines = [f"# GPU suite: {result['gpu']} ({result['date']})", "",
             "| case | backend | adapter | plan GiB | reserved GiB | allocated GiB | error | init s | first step s "
             "| tokens/s | MFU | loss | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cases"]:
        def f(key, fmt="{:.2f}"):
            return fmt.format(r[key]) if r.get(key) is not None else "-"
        loss = (f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}" if r.get("loss_first") is not None else "-")
        lines.append(f"| {r['case']} | {r.get('backend', '-')} | {r.get('adapter', '-')} | {f('plan_gb')} | "
                     f"{f('measured_reserved_gb')} | {f('measured_allocated_gb')} | {f('plan_error', '{:+.1%}')} | "
                     f"{f('init_s', '{:.1f}')} | {f('first_step_s', '{:.1f}')} | "
                     f"{f('tokens_per_s', '{:.0f}')} | {f('mfu', '{:.1%}')} | {loss} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for runs, JSON and Markdown")
    ap.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], help="default: all; run in the order given")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pytest", action="store_true", help="also run `pytest -m gpu` and record its summary")
    ap.add_argument("--smoke", action="store_true", help="check the harness on a CPU with a tiny shape")
    ap.add_argument("--budget-s", type=float, help="start no case after this many seconds (recorded as not run)")
    ap.add_argument("--results", type=Path, help="where the JSON and Markdown go, rewritten after every case "
                                                  "(default: --out); runs, data and recipes stay in --out")
    args = ap.parse_args(argv)
    budget = common.Budget(args.budget_s)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = (args.results or args.out).resolve()
    results.mkdir(parents=True, exist_ok=True)
    by_name = {c.name: c for c in CASES}
    cases = [by_name[name] for name in args.cases] if args.cases else CASES  # in the order asked for
    date = datetime.date.today().isoformat()
    result = {**common.gpu_info(), "date": date, "versions": common.versions(), "steps": args.steps,
              "flop_convention": common.__doc__.split("FLOP convention (for MFU): ")[1].split("\n\n")[0].replace("\n", " "),
              "cases": []}
    for case in cases:
        if not budget.left():
            result["cases"].append({"case": case.name, "status": "skipped", "why": "not run: time budget spent"})
            continue
        print(f"[suite] {case.name} ...", flush=True)
        row = run_case(case, out, args.steps, args.smoke)
        print(f"[suite] {case.name}: {row['status']} " + json.dumps({k: row.get(k) for k in (
            "plan_gb", "measured_reserved_gb", "plan_error", "init_s", "first_step_s", "tokens_per_s", "mfu",
            "loss_first", "loss_last")}), flush=True)
        result["cases"].append(row)
        write_results(results, date, result)  # a lease cut short keeps every case that finished
    if args.pytest:
        result["cases"].append(run_pytest_gpu(out))
    write_results(results, date, result)
    print(markdown(result))
    return 0 if all(r["status"] in ("ok", "skipped") for r in result["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
