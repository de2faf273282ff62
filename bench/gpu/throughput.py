"""Tokens per GPU-second and MFU of recipeforge against a bare TRL SFTTrainer script, same settings, same call.

    python bench/gpu/throughput.py --out DIR                 # every case on this machine's GPU
    python bench/gpu/throughput.py --out DIR --cases 3b-full
    python bench/gpu/throughput.py --out DIR --smoke         # the harness itself on a CPU, tiny shapes

Cases: SFT at sequence 4096 with packing in bf16, random init from bench/gpu/models (common.py): a
Llama-3.2-3B shape in full, a Llama-3.1-8B shape with LoRA and with QLoRA, and the 8B in full with
what the planner picks on one GPU. Each case runs `recipeforge train`, then trl_reference.py with the
micro batch, accumulation, checkpointing, optimizer (and DeepSpeed config) of the recipeforge run.
MFU uses the FLOP convention in common.py over the GPU's dense bf16 peak from the planner's table
(989 TFLOP/s for H100 SXM and H200). Writes DIR/gpu-throughput-<date>.json:
{"gpu", "peak_tflops", "cases": [{"case", "tokens_per_s", "trl_tokens_per_s", "ratio", "mfu"}, ...]}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    adapter: str = "none"
    micro_batch: int | str = 1
    checkpointing: bool | str = True
    global_batch: int = 16
    settings: dict = field(default_factory=dict)


CASES = [
    Case("3b-full", "llama-3.2-3b", micro_batch=2, checkpointing=True),
    Case("8b-lora", "llama-3.1-8b", "lora", micro_batch=2, checkpointing=True),
    Case("8b-qlora", "llama-3.1-8b", "qlora", micro_batch=2, checkpointing=True),
    Case("8b-full-planned", "llama-3.1-8b", micro_batch="auto", checkpointing="auto", global_batch=8),
]
SEQ = 4096


def adapter_settings(kind: str) -> dict:
    if kind == "none":
        return {}
    out = {"type": kind, "r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
    if kind == "qlora":
        out["quant"] = {"bits": 4, "quant_type": "nf4", "double_quant": True}
    return {"adapter": out}


def deepspeed_json(recipe_path: Path, out: Path) -> Path | None:
    """The DeepSpeed config recipeforge runs for this recipe on this machine (None off DeepSpeed)."""
    from recipeforge.config import load_recipe
    from recipeforge.backends.artifacts import deepspeed_config
    from recipeforge.plan import make_plan

    recipe = load_recipe(recipe_path).recipe
    plan = make_plan(recipe)
    if plan.backend != "deepspeed":
        return None
    path = out / f"{recipe_path.stem}-deepspeed.json"
    path.write_text(json.dumps(deepspeed_config(plan, recipe), indent=2))
    return path


def run_case(case: Case, out: Path, steps: int, smoke: bool) -> dict:
    seq = 256 if smoke else SEQ
    model = common.model_dir(case.model, smoke, out)
    # Under --smoke fewer rows, in a file of their own (common.SMOKE_ROWS), and two micro batches a step.
    data = out / "data" / ("smoke-sft.jsonl" if smoke else "sft.jsonl")
    if not data.exists():
        common.write_jsonl(data, common.synthetic_rows(common.SMOKE_ROWS if smoke else 8000))
    global_batch = common.smoke_global_batch(case.global_batch, case.micro_batch) if smoke else case.global_batch
    base = common.base_recipe(model, data, seq=seq, steps=steps, global_batch=global_batch,
                              micro_batch=case.micro_batch, checkpointing=case.checkpointing)
    if smoke:
        base["model"]["dtype"] = "auto"
    recipe = common.write_recipe(out / "recipes" / f"{case.name}.yaml",
                                 common.merge(base, {**adapter_settings(case.adapter), **case.settings}))
    plan = common.plan_json(recipe)
    row = {"case": case.name, "backend": plan["backend"], "offload": plan["offload"],
           "micro_batch": plan["micro_batch_size"], "gradient_accumulation": plan["gradient_accumulation"],
           "gradient_checkpointing": plan["gradient_checkpointing"]}
    run_dir = out / "runs" / case.name
    proc, wall = common.train(recipe, run_dir, timeout=common.CASE_TIMEOUT_S["smoke" if smoke else "gpu"])
    row["deps"] = common.case_deps(run_dir, common.MODELS / case.model / "config.json")
    if proc.returncode != 0:
        common.prune(run_dir)
        return {**row, "status": f"recipeforge failed (exit {proc.returncode})", "why": common.tail(proc.stderr, 3000)}
    got = common.measured(run_dir, seq=seq, global_batch=global_batch)
    common.prune(run_dir)
    row.update(tokens_per_s=got["tokens_per_s"], loss_first=got["loss_first"], loss_last=got["loss_last"],
               measured_reserved_gb=got["measured_reserved_gb"], init_s=got["init_s"],
               first_step_s=got["first_step_s"], wall_s=round(wall, 1))

    ref_out = out / "trl" / f"{case.name}.json"
    ref_out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).with_name("trl_reference.py")), "--config", str(model),
           "--data", str(data), "--seq", str(seq), "--micro", str(plan["micro_batch_size"]),
           "--accum", str(plan["gradient_accumulation"]), "--steps", str(steps), "--adapter", case.adapter,
           "--out", str(ref_out)]
    if plan["gradient_checkpointing"]:
        cmd.append("--checkpointing")
    ds = deepspeed_json(recipe, out)
    if ds is not None:
        cmd += ["--deepspeed", str(ds)]
    ref = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO, timeout=3000)
    if ref.returncode != 0:
        return {**row, "status": "trl reference failed", "why": common.tail(ref.stderr, 3000)}
    trl = json.loads(ref_out.read_text())
    row.update(trl_tokens_per_s=trl["tokens_per_s"], trl_loss_last=trl["loss_last"],
               trl_peak_reserved_gb=trl["peak_reserved_gb"])
    if row["tokens_per_s"] and row["trl_tokens_per_s"]:
        row["ratio"] = round(row["tokens_per_s"] / row["trl_tokens_per_s"], 3)
    peak = common.gpu_info().get("peak_tflops")
    if peak and row["tokens_per_s"]:
        config = json.loads((model / "config.json").read_text())
        row["mfu"] = round(common.model_flops_per_token(config, seq) * row["tokens_per_s"] / (peak * 1e12), 4)
    row["status"] = "ok"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", nargs="+", choices=[c.name for c in CASES])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="check the harness on a CPU with a tiny shape")
    ap.add_argument("--budget-s", type=float, help="start no case after this many seconds (recorded as not run)")
    ap.add_argument("--results", type=Path, help="where the JSON goes, rewritten after every case (default: --out)")
    args = ap.parse_args(argv)
    budget = common.Budget(args.budget_s)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = (args.results or args.out).resolve()
    results.mkdir(parents=True, exist_ok=True)
    info = common.gpu_info()
    date = datetime.date.today().isoformat()
    result = {"gpu": info["gpu"], "peak_tflops": info["peak_tflops"], "date": date, "sequence_len": 256 if args.smoke else SEQ,
              "versions": common.versions(), "steps": args.steps, "cases": []}
    by_name = {c.name: c for c in CASES}
    for case in [by_name[n] for n in args.cases] if args.cases else CASES:  # in the order asked for
        if not budget.left():
            result["cases"].append({"case": case.name, "status": "skipped", "why": "not run: time budget spent"})
            continue
        print(f"[throughput] {case.name} ...", flush=True)
        row = run_case(case, out, args.steps, args.smoke)
        print(f"[throughput] {case.name}: " + json.dumps({k: row.get(k) for k in (
            "status", "tokens_per_s", "trl_tokens_per_s", "ratio", "mfu")}), flush=True)
        result["cases"].append(row)
        tmp = results / f".gpu-throughput-{date}.json.tmp"  # a lease cut short keeps every case that finished
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(results / f"gpu-throughput-{date}.json")
    return 0 if all(r["status"] in ("ok", "skipped") for r in result["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
