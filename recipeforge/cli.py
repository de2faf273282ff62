"""The `recipeforge` command line: parse arguments, call the library, render results and errors.

Light paths (`--help`, `validate`, `resolve`, `schema`, `plan`, `launch`) import neither torch nor
transformers; training imports them only inside the commands that train.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from recipeforge import __version__
from recipeforge.errors import RecipeError

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_PUSH_FAILED = 3  # `train`: the run finished and is saved; only output.push_to_hub failed
EXIT_CHECK_FAILED = 4  # `export`: written, but its self-check found it too far from the unquantized model


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides such as train.learning_rate=1e-4; ~key deletes a key")


def build_parser() -> argparse.ArgumentParser:
    """The command line: global flags, then each command's arguments (in the order --help lists them)."""
    parser = argparse.ArgumentParser(
        prog="recipeforge",
        description="Train LLMs from one declarative YAML recipe: validate it, plan the distributed "
                    "backend and memory, and run pretrain / SFT / DPO / GRPO on the Hugging Face stack.",
        epilog="Exit codes: 0 ok, 2 problem in the input (recipe, data, arguments, a run directory in use), "
               "1 internal error, 75 training stopped by SIGTERM/SIGUSR1/Ctrl-C after saving a checkpoint (run "
               "the same command again to resume), 130 aborted by a second Ctrl-C, 3 (train) the run finished and "
               "is saved but output.push_to_hub failed (`recipeforge push RUN_DIR` retries). "
               "--debug (or RECIPEFORGE_DEBUG=1) shows tracebacks.")
    parser.add_argument("--version", action="version", version=f"recipeforge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--verbose", action="store_true",
                        help="show the libraries' warnings on the console (by default a run writes them to "
                             "RUN_DIR/logs/warnings.log); same as RECIPEFORGE_VERBOSE=1")
    parser.add_argument("--trust-code", action="store_true",
                        help="allow the recipe or the command to run Python code it names: a reward by dotted "
                             "path (my_mod:f), model.trust_remote_code, lm-eval task files (.yaml); same as "
                             "allow_code: true in the recipe")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _recipe_commands(sub)
    _report_convert_schema_commands(sub)
    _plan_train_commands(sub)
    _launch_prepare_commands(sub)
    _after_training_commands(sub)
    return parser


def _recipe_commands(sub: Any) -> None:
    """The commands plugins, validate, resolve and diff: reading recipes."""
    p = sub.add_parser("plugins", help="list plugin components by group: name, distribution, version, status")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("validate", help="check a recipe and report every problem with its file:line")
    _recipe_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("resolve", help="print the fully resolved recipe (extends, overrides, ${...}, defaults)")
    _recipe_args(p)
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--lock", action="store_true",
                   help="add a `lock:` section: package versions, the model's revision, dataset fingerprints "
                        "and the planned hardware (`train` warns when they differ; `train --strict` refuses)")
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("diff", help="the difference of two resolved recipes (recipe, run dir or lock file); "
                                    "exit 0 equal, 1 different, 2 bad input")
    p.add_argument("a", help="recipe file, lock file or run directory")
    p.add_argument("b", help="recipe file, lock file or run directory")
    p.set_defaults(func=cmd_diff)


def _report_convert_schema_commands(sub: Any) -> None:
    """The commands report, convert and schema."""
    p = sub.add_parser("report", help="charts of one or several runs (loss, learning rate, rewards, ...) in one "
                                      "self-contained HTML page",
                       description="Read metrics.jsonl, resolved_recipe.yaml and plan.json of each run (finished or "
                                   "still training) and write one HTML page with the charts embedded, plus the "
                                   "PNGs next to it. Several runs are overlaid, with a table of their recipe "
                                   "differences. Needs matplotlib: pip install 'recipeforge[report]'.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory written by `recipeforge train`")
    p.add_argument("--out", metavar="FILE.html",
                   help="page to write (default: RUN_DIR/report.html for one run, ./report.html for several)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("convert", help="convert another tool's config to a recipe (axolotl)")
    p.add_argument("tool", choices=("axolotl",), help="the tool the config is written for")
    p.add_argument("config", help="the tool's YAML config")
    p.add_argument("-o", "--output", help="write the recipe to this file instead of stdout")
    p.add_argument("--world-size", type=int, default=1,
                   help="GPUs the config was run on, for the global batch (micro x accumulation x world size; "
                        "default 1)")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("schema", help="print the recipe's JSON Schema (or the Markdown reference)")
    p.add_argument("--format", choices=("json", "markdown"), default="json")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_schema)


def _plan_train_commands(sub: Any) -> None:
    """The commands plan and train."""
    p = sub.add_parser("plan", help="choose backend, batch sizes and per-GPU memory for a recipe, with reasons")
    _recipe_args(p)
    p.add_argument("--hardware", help="plan for this hardware instead of this machine: 8xH100-80GB, "
                                      "2x8xA100-80GB (nodes x gpus), cpu")
    p.add_argument("--nproc-per-node", type=int,
                   help="plan for this many processes per node, as `train --nproc-per-node` (CPU runs over gloo)")
    p.add_argument("--nnodes", type=int, help="plan for this many nodes, as `train --nnodes`")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("train", help="plan and run a recipe; writes the run directory",
                       description="Plan the recipe, then train in this process or start the backend's launcher "
                                   "(accelerate launch / torchrun) with the plan's process count. Also runs as a "
                                   "worker under `accelerate launch -m recipeforge train` or `torchrun -m ...`.",
                       epilog="SIGTERM, SIGUSR1 or a first Ctrl-C: every process finishes its step, a checkpoint "
                              "is saved, and train exits with 75; the same command resumes. A second Ctrl-C "
                              "aborts (exit 130). One run per output.dir: a second train into a directory in "
                              "use exits with 2.")
    _recipe_args(p)
    p.add_argument("--overwrite", action="store_true",
                   help="delete what the run directory holds (another run, or a finished one) and start over")
    p.add_argument("--force", action="store_true",
                   help="continue an earlier run of this directory although the recipe changed (the refusal "
                        "without it lists the changes)")
    _launch_args(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the launch command, its environment and the generated files; start nothing")
    p.add_argument("--strict", action="store_true",
                   help="a locked recipe: refuse (exit 2) when package versions, the model revision, data or "
                        "hardware differ from its `lock:` (without it: a warning per difference)")
    p.set_defaults(func=cmd_train)


# `launch` flags that belong to one scheduler, by flag and argparse dest: given with the other, they are refused.
SLURM_FLAGS = {"--partition": "partition", "--account": "account", "--time": "time", "--qos": "qos",
               "--cpus-per-task": "cpus_per_task", "--sbatch-option": "sbatch_option"}
K8S_FLAGS = {"--image": "image", "--pvc": "pvc", "--k8s-api": "k8s_api", "--namespace": "namespace",
             "--grace-period": "grace_period"}
RAY_FLAGS = {"--ray-address": "ray_address", "--overwrite": "overwrite", "--force": "force", "--dry-run": "dry_run"}


def _launch_prepare_commands(sub: Any) -> None:
    """The commands launch, preprocess and convert-checkpoint: before a run."""
    p = sub.add_parser("launch", help="write a cluster job for a recipe: an sbatch script (Slurm) or "
                                      "Kubernetes manifests (Kubeflow TrainJob or PyTorchJob); or run it on a "
                                      "Ray cluster (Ray Train)")
    _recipe_args(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--slurm", action="store_true",
                       help="write an sbatch script that runs one recipeforge launcher per node")
    where.add_argument("--k8s", action="store_true",
                       help="write a ConfigMap with the resolved recipe and a job running one recipeforge "
                            "launcher per pod (one pod per node), as multi-document YAML")
    where.add_argument("--ray", action="store_true",
                       help="train on an existing Ray cluster through Ray Train's TorchTrainer, one Ray worker per "
                            "planned process, and wait for it (as `train` with distributed.launcher: ray)")
    p.add_argument("-o", "--output", help="where to write (default: RUN_DIR/slurm.sbatch for --slurm, stdout "
                                          "for --k8s)")
    p.add_argument("--hardware", help="the cluster's nodes, when the recipe has no `hardware:` section: "
                                      "2x8xH100-80GB (nodes x GPUs), 8xA100-80GB; the job is planned for them, "
                                      "not for this machine (a login node rarely has the GPUs)")
    p.add_argument("--nproc-per-node", type=int, help="processes per node for a CPU-only recipe")
    p.add_argument("--master-port", type=int, help="rendezvous port on the first node (default 29500)")
    g = p.add_argument_group("Slurm (--slurm)")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--time", help="wall-clock limit, e.g. 48:00:00")
    g.add_argument("--qos")
    g.add_argument("--cpus-per-task", type=int)
    g.add_argument("--sbatch-option", action="append", default=[], metavar="OPTION",
                   help="another #SBATCH line, e.g. --sbatch-option=--constraint=h100 (repeatable)")
    g = p.add_argument_group("Kubernetes (--k8s)")
    g.add_argument("--image", help="container image the pods run, with recipeforge installed (required)")
    g.add_argument("--pvc", metavar="NAME", help="PersistentVolumeClaim for the run directory and the download "
                                                 "cache, mounted in every pod (required; ReadWriteMany for "
                                                 "several nodes)")
    g.add_argument("--k8s-api", metavar="KIND", help="trainjob (default: Kubeflow Trainer v2, "
                                                      "trainer.kubeflow.org/v1alpha1) or pytorchjob (Kubeflow "
                                                      "Training Operator, kubeflow.org/v1)")
    g.add_argument("--namespace", help="namespace of the job and its ConfigMap (default: kubectl's)")
    g.add_argument("--grace-period", type=int, metavar="SECONDS",
                   help="terminationGracePeriodSeconds: time between SIGTERM and SIGKILL for the checkpoint "
                        "save (default 120, the lead `--slurm` asks for)")
    g = p.add_argument_group("Ray (--ray)")
    g.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster: host:port of its head, ray://host:10001, or auto (default: "
                        "distributed.ray_address, else RAY_ADDRESS, else auto)")
    g.add_argument("--overwrite", action="store_true", help="as `train --overwrite`")
    g.add_argument("--force", action="store_true", help="as `train --force`")
    g.add_argument("--dry-run", action="store_true",
                   help="print the Ray job (workers, resources, their command and environment) and the generated "
                        "files; start nothing")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("preprocess", help="tokenize and cache a recipe's datasets ahead of training")
    _recipe_args(p)
    p.set_defaults(func=cmd_preprocess, owns_process=True)

    p = sub.add_parser("convert-checkpoint",
                       help="convert a recipe's Hugging Face model to a Megatron checkpoint (cached; megatron "
                            "backend), or into -o DIR at any tensor-parallel size, or a Megatron checkpoint back "
                            "to Hugging Face safetensors (--to-hf)")
    _recipe_args(p)
    p.add_argument("-o", "--output", help="write here instead of the cache: DIR/megatron/ckpt (and DIR/base_model "
                                          "for a tiny: model), or with --to-hf the safetensors")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="convert in N processes (gloo on the CPU), each holding 1/N of the split weights "
                        "(needs -o; default 1)")
    p.add_argument("--to-hf", metavar="CHECKPOINT",
                   help="export this Megatron checkpoint (a ckpt folder, or a run's checkpoints folder) of the "
                        "recipe's model to Hugging Face safetensors in -o DIR")
    p.set_defaults(func=cmd_convert_checkpoint)


def _after_training_commands(sub: Any) -> None:
    """The commands merge, export, chat, serve, eval (`_eval_command`) and push: what a finished run is used for."""
    p = sub.add_parser("merge", help="merge a run's LoRA adapter into its base model (safetensors)")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("-o", "--output", help="output directory (default: RUN_DIR/merged)")
    p.set_defaults(func=cmd_merge, cleans_up=True)
    _export_command(sub)

    p = sub.add_parser("chat", help="talk to a finished run's model in the terminal (streamed replies)",
                       description="Chat with final/ of a run (a LoRA adapter is loaded on its base, not merged), "
                                   "through the chat template the run trained with. /reset forgets the "
                                   "conversation, /exit leaves, a line of three double quotes starts and ends a "
                                   "multi-line message, Ctrl-C stops a reply.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--system", help="system prompt for the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest reply, in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 for greedy (default 0.7)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="where the model runs (default: cuda when present)")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("serve", help="serve a finished run's model on an OpenAI-compatible HTTP API",
                       description="Serve final/ of a run at /v1/chat/completions, /v1/completions (streamed or "
                                   "not) and /v1/models. --engine vllm hands it to `vllm serve` (a LoRA adapter "
                                   "served as an adapter on its base); transformers (the default without vLLM) "
                                   "answers one request at a time. Binds to 127.0.0.1 unless --host says otherwise.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 takes any free port)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $RECIPEFORGE_API_KEY, else no "
                                      "key; the variable keeps the key out of the process list)")
    p.add_argument("--insecure", action="store_true",
                   help="serve on an address other machines reach (--host) without an API key (warned)")
    p.add_argument("--name", help="the model's name in the API (default: the run directory's name)")
    p.add_argument("--engine", choices=["auto", "transformers", "vllm"], default="auto",
                   help="auto (default): vllm when it is installed, else transformers")
    p.add_argument("--device", choices=["cpu", "cuda"], help="transformers engine: where the model runs "
                                                            "(default: cuda when present)")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION",
                   help="vllm engine: the share of the GPU (on a CPU: of host memory) vLLM takes for weights and "
                        "KV cache (default: vLLM's own, 0.92 of a GPU's memory)")
    p.set_defaults(func=cmd_serve)

    _eval_command(sub)

    p = sub.add_parser("push", help="upload a finished run's model and model card to the Hugging Face Hub",
                       description="Upload final/ (merged/ when the run merged its adapter) and the model card "
                                   "README.md; never checkpoints, optimizer states, logs or the run lock. The "
                                   "repository comes from the run's output.push_to_hub unless --repo-id is given.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--repo-id", help="target repository, e.g. my-org/my-model (default: output.push_to_hub.repo_id)")
    p.add_argument("--public", action="store_true", help="create the repository as public (default: private, "
                                                         "or the run's output.push_to_hub.private)")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded; upload nothing")
    p.set_defaults(func=cmd_push)


def _export_command(sub: Any) -> None:
    """The command export: a finished run's model in a format serving engines load."""
    # The format names come from the light formats module (no torch): --help stays fast.
    from recipeforge.outputs.exporters.formats import FORMAT_SPECS

    p = sub.add_parser("export", help="write a run's model for serving: merged safetensors, torchao int8/int4 or "
                                      "compressed-tensors, checked against the unquantized model",
                       description="Write final/ (a LoRA adapter merged into its base first) in FORMAT, with a "
                                   "README.md saying how to load it and export.json with its self-check: the export "
                                   "is loaded back with transformers and its perplexity on a few held rows (the "
                                   "run's evaluation data, else fixed prompts) must stay within the format's bound "
                                   "of the unquantized model's. Formats: " + "; ".join(
                                       f"{s.name}: {s.summary}" + (" (not written by recipeforge: the error says "
                                                                   "what to run)" if s.elsewhere else "")
                                       for s in FORMAT_SPECS.values()) + ".",
                       epilog="Exit codes: 0 written and checked, 2 bad input (nothing written), 4 written but the "
                              "self-check failed (export.json has the numbers).")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help="one of: " + ", ".join(s.name.value for s in FORMAT_SPECS.values()))
    p.add_argument("-o", "--output", help="output directory (default: RUN_DIR/export-FORMAT)")
    p.add_argument("--overwrite", action="store_true", help="replace an output directory that already holds files")
    p.add_argument("--no-check", action="store_true",
                   help="skip the self-check (loading the export back and comparing it with the unquantized model)")
    p.set_defaults(func=cmd_export, cleans_up=True)


def _eval_command(sub: Any) -> None:
    """The command eval: benchmarks of finished runs."""
    p = sub.add_parser("eval", help="benchmark a finished run's model with lm-evaluation-harness; two runs: a "
                                    "comparison table",
                       description="Evaluate final/ of a run (a LoRA adapter on its base, not merged) with "
                                   "EleutherAI's lm-evaluation-harness (HF backend) on lm-eval tasks by name and "
                                   "local tasks (a .jsonl of {prompt, reference} or {prompt, choices, answer} rows, "
                                   "or an lm-eval task .yaml). Scores go to RUN_DIR/eval/<task>.json, the model "
                                   "card and `recipeforge report`. Needs lm-eval: pip install 'recipeforge[eval]'.")
    p.add_argument("targets", nargs="+", metavar="RUN_DIR|RECIPE",
                   help="run directory, or the recipe that trained it; several: evaluated on the same tasks and "
                        "compared")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help="lm-eval task names or local task files, space- or comma-separated (default: the "
                        "recipe's eval.tasks)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="prompts per forward pass (default: eval.batch_size, else 8 on the CPU and lm-eval's "
                        "out-of-memory-safe `auto` on a GPU)")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N examples of each task")
    p.add_argument("--checkpoints", action="store_true",
                   help="also evaluate every checkpoint kept in RUN_DIR/checkpoints (into eval/checkpoint-N/)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="where the model runs (default: cuda when present)")
    p.set_defaults(func=cmd_eval, cleans_up=True)


# -- commands ---------------------------------------------------------------------------------------

def _load(args):
    from recipeforge.config import load_recipe

    loaded = load_recipe(args.recipe, list(args.overrides), flags=_flag_values(args))
    args.loaded = loaded  # lets errors raised later (planner, data) point into the recipe
    from recipeforge.config.load import check_finite_numbers

    check_finite_numbers(loaded.recipe.model_dump(), loaded.tree.locate)  # '1e999' or 'nan' for a number
    trains = args.command == "train" or getattr(args, "ray", False)  # `launch --ray` trains too
    if args.command in ("validate", "plan") or trains:
        from recipeforge.config.validate import check_components

        check_components(loaded)
    if args.command == "validate" or trains:
        # Local eval task files and lm-eval itself are checked before hours of training, not after.
        from recipeforge.outputs.evaluation.tasks import check_recipe_tasks

        section = loaded.recipe.eval
        check_recipe_tasks(list(section.tasks), Path(loaded.path).resolve().parent,
                           needs_harness=section.after_training, allow_code=loaded.recipe.allow_code)
    return loaded


def _flag_values(args) -> list:
    """What the command's flags put into the recipe, whatever the recipe sets itself."""
    from recipeforge.config.overrides import FlagValue

    flags = []
    if getattr(args, "hardware", None):
        from recipeforge.plan.hardware import parse_hardware

        # `--hardware` replaces the recipe's `hardware:` section (or stands in for a missing one) as the
        # target, for the checks made while loading (which backend runs on which device) as for the planner.
        flags.append(FlagValue(("hardware",), parse_hardware(args.hardware, nnodes=getattr(args, "nnodes", None)).as_section(),
                               f"--hardware {args.hardware}"))
    return flags


def cmd_validate(args) -> int:
    loaded = _load(args)
    r = loaded.recipe
    from recipeforge.errors import bounded_text

    print(bounded_text(f"ok: {args.recipe} is a valid {r.stage} recipe (model {r.model.name_or_path}, "
                       f"adapter {r.adapter.type})"))
    return 0


def cmd_resolve(args) -> int:
    from recipeforge.config.dump import dump_recipe

    loaded = _load(args)
    if not args.lock:
        _write(dump_recipe(loaded), args.output)
        return 0
    import yaml

    from recipeforge.config.dump import resolved_data
    from recipeforge.config.lock import build_lock, plan_hardware
    from recipeforge.plan import hardware_for
    from recipeforge.plan.world import plan_for_world

    plan = plan_for_world(loaded.recipe, hardware=hardware_for(loaded.recipe, None))
    data = {**resolved_data(loaded), "lock": build_lock(loaded, plan_hardware(plan))}
    _write(f"# Resolved and locked by recipeforge {__version__} from {loaded.path}; `recipeforge train` warns "
           f"when this environment differs from `lock:` (--strict: refuses).\n"
           + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100), args.output)
    return 0


def cmd_diff(args) -> int:
    from recipeforge.outputs.recipe_diff import diff_sides, render_diff

    recipe_lines, lock_lines = diff_sides(args.a, args.b)
    sys.stdout.write(render_diff(args.a, args.b, recipe_lines, lock_lines))
    return 1 if recipe_lines or lock_lines else 0


def cmd_report(args) -> int:
    from recipeforge.outputs.report import write_report

    report = write_report(args.run_dirs, args.out)
    print(f"report of {', '.join(report.runs)} written to {report.html} ({len(report.images)} charts)")
    return 0


def cmd_convert(args) -> int:
    from recipeforge.config.axolotl import convert_file

    if args.world_size < 1:
        raise RecipeError("--world-size must be 1 or more", key="--world-size")
    result = convert_file(args.config, world_size=args.world_size)
    sys.stderr.write(result.report_text())
    _write(result.recipe_text(), args.output)
    return 0


def cmd_schema(args) -> int:
    if args.format == "json":
        from recipeforge.config.jsonschema import recipe_json_schema

        text = json.dumps(recipe_json_schema(), indent=2) + "\n"
    else:
        from recipeforge.config.reference import recipe_reference_markdown

        text = recipe_reference_markdown()
    _write(text, args.output)
    return 0


def cmd_plugins(args) -> int:
    from recipeforge.plugins import plugins_report, render_plugins

    print(json.dumps(plugins_report(), indent=2, default=str) if args.json else render_plugins())
    return 0


def cmd_plan(args) -> int:
    from recipeforge.plan import hardware_for, parse_hardware, render_plan
    from recipeforge.plan.world import plan_for_world

    loaded = _load(args)
    # The same planning `train` does for the same process layout.
    hardware = parse_hardware(args.hardware, nnodes=args.nnodes) if args.hardware else hardware_for(loaded.recipe, None)
    plan = plan_for_world(loaded.recipe, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, hardware=hardware)
    from recipeforge.components.data_checks import check_plan_numbers

    check_plan_numbers(plan)
    from recipeforge.credentials import redact_credentials

    print(redact_credentials(json.dumps(plan.to_dict(), indent=2, default=str)) if args.json
          else render_plan(plan))
    return 0


def _launch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("processes and nodes (multi-node: one `recipeforge train` per node; "
                             "under Slurm they are read from its environment)")
    g.add_argument("--nproc-per-node", type=int,
                   help="processes per node: CPU runs (gloo) need it for more than one; GPU runs default to "
                        "one per GPU of the plan")
    g.add_argument("--nnodes", type=int, help="nodes in the job")
    g.add_argument("--node-rank", type=int, help="this node's rank, 0 on the main node")
    g.add_argument("--master-addr", help="hostname or IP of the main node")
    g.add_argument("--master-port", type=int, help="rendezvous port on the main node (default 29500)")


def cmd_train(args) -> int:
    from recipeforge.run import LaunchOptions

    loaded = _load(args)
    opts = LaunchOptions(recipe_path=args.recipe, overrides=tuple(args.overrides),
                         nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                         master_addr=args.master_addr, master_port=args.master_port, dry_run=args.dry_run,
                         strict=args.strict, **_worker_flags(args))
    return _train(args, loaded, opts)


def _worker_flags(args) -> dict[str, bool]:
    """The launching command's flags its workers get on their command line."""
    from recipeforge.outputs.console import verbose
    from recipeforge.registry import code_trust

    return dict(debug=args.debug or os.environ.get("RECIPEFORGE_DEBUG", "") not in ("", "0"),
                verbose=verbose(), trust_code=code_trust()[0])


def _train(args, loaded, opts) -> int:
    """Train `loaded` as `opts` says (`train`, `launch --ray`) and report the result."""
    from recipeforge.run import LaunchFailed, summary, train
    from recipeforge.outputs.hub import PushFailed
    from recipeforge.backends.worker_spec import launched_worker
    from recipeforge.stages.base import DistInfo
    from recipeforge.stages.preemption import EXIT_PREEMPTED, Preempted

    try:
        run_dir = train(loaded, overwrite=args.overwrite, force=args.force, launch=opts)
    except LaunchFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code if exc.code > 0 else EXIT_INTERNAL_ERROR
    except PushFailed as exc:  # trained and saved; only the upload failed (its hint says how to retry)
        from recipeforge.config.secrets import scrub

        print(f"error: {scrub(exc.render())}", file=sys.stderr)
        return EXIT_PUSH_FAILED
    except Preempted as stop:
        if launched_worker():
            return 0  # a launched worker: the launching command reports (and exits 75)
        if DistInfo.from_env().is_main:
            from recipeforge.config.secrets import scrub

            again = resume_command(args)
            shown = scrub(again)
            note = "" if shown == again else " (with the credentials you gave in place of <redacted>)"
            print(f"[recipeforge] {stop.describe()}\n[recipeforge] to continue, run the same command again "
                  f"(it resumes from the newest checkpoint){note}: {shown}", file=sys.stderr)
        return EXIT_PREEMPTED
    if run_dir is None:  # --dry-run printed the launch
        return 0
    if launched_worker() or not DistInfo.from_env().is_main:
        return 0  # a worker: the launching command (or, launched directly, rank 0) reports
    learned = ", ".join(f"{k} {v['first']:.4g} -> {v['last']:.4g}" for k, v in summary(run_dir).items())
    print(f"run written to {run_dir}" + (f" ({learned})" if learned else ""))
    return 0


def resume_command(args) -> str:
    """The command that continues a stopped `train` (or `launch --ray`): the same recipe, overrides and
    every flag the run depends on (the code opt-in, the process layout, --strict, the Ray cluster), and
    never --overwrite (it would delete the checkpoint to resume from) or --dry-run."""
    import shlex

    argv = ["recipeforge", *(["--trust-code"] if args.trust_code else [])]
    if getattr(args, "ray", False):
        argv += ["launch", "--ray", args.recipe, *args.overrides]
        valued = (("--ray-address", args.ray_address), ("--nproc-per-node", args.nproc_per_node))
    else:
        argv += ["train", args.recipe, *args.overrides]
        valued = (("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes), ("--node-rank", args.node_rank),
                  ("--master-addr", args.master_addr), ("--master-port", args.master_port))
        if args.strict:
            argv.append("--strict")
    for flag, value in valued:
        if value is not None:
            argv += [flag, str(value)]
    return shlex.join(argv)


def cmd_launch(args) -> int:
    _check_scheduler_flags(args)
    if args.k8s:
        return _launch_k8s(args)
    if args.ray:
        return _launch_ray(args)
    from recipeforge.backends.slurm import SlurmOptions, write_sbatch

    options = SlurmOptions(partition=args.partition, account=args.account, time=args.time,
                           cpus_per_task=args.cpus_per_task, qos=args.qos, extra=tuple(args.sbatch_option))
    # Each node's `recipeforge train` plans for the same hardware the script was planned for.
    overrides = [*args.overrides, *_hardware_overrides(args)]
    path = write_sbatch(_load(args), recipe=args.recipe, overrides=overrides, options=options,
                        nproc_per_node=args.nproc_per_node, port=args.master_port,
                        output=args.output)
    print(f"sbatch script written to {path}\nsubmit it with: sbatch {shlex.quote(str(path))}")
    return 0


def _hardware_overrides(args) -> list[str]:
    """`--hardware` as recipe overrides (``hardware.nodes=2`` ...), for commands that run elsewhere."""
    if not getattr(args, "hardware", None):
        return []
    from recipeforge.plan.hardware import parse_hardware

    section = parse_hardware(args.hardware).as_section()
    return [f"hardware.{key}={value}" for key, value in section.items()]


def _check_scheduler_flags(args) -> None:
    """A flag of one launch target (--slurm, --k8s, --ray) given with another is a mistake worth saying."""
    mode = "--k8s" if args.k8s else "--ray" if args.ray else "--slurm"
    other = {"--slurm": {**K8S_FLAGS, **RAY_FLAGS}, "--k8s": {**SLURM_FLAGS, **RAY_FLAGS},
             "--ray": {**SLURM_FLAGS, **K8S_FLAGS}}[mode]
    given = [flag for flag, dest in other.items() if getattr(args, dest) not in (None, [], False)]
    if given:
        owner = {**{f: "--slurm" for f in SLURM_FLAGS}, **{f: "--k8s" for f in K8S_FLAGS}, **{f: "--ray" for f in RAY_FLAGS}}
        raise RecipeError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for launch "
                          f"{owner[given[0]]} only, not {mode}")


def _launch_ray(args) -> int:
    """`launch --ray`: `train` with its workers started by Ray Train on a Ray cluster, in the foreground
    (exit codes as `train`'s: 0, 2, 75, 1)."""
    from recipeforge.backends.ray_launch import check_ray_installed
    from recipeforge.run import LaunchOptions

    given = [flag for flag, value in (("-o/--output", args.output), ("--master-port", args.master_port)) if value]
    if given:  # Ray sets up the workers' rendezvous, and the run directory is what the launch writes
        raise RecipeError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for launch --slurm and --k8s, "
                          "not --ray")
    if not args.dry_run:
        check_ray_installed()  # before planning: a short error without Ray
    args.overrides = [*args.overrides, *_hardware_overrides(args)]  # the workers plan nothing; they load the same
    loaded = _load(args)
    opts = LaunchOptions(recipe_path=args.recipe, overrides=tuple(args.overrides), nproc_per_node=args.nproc_per_node,
                         dry_run=args.dry_run, ray=True, ray_address=args.ray_address, **_worker_flags(args))
    return _train(args, loaded, opts)


def _launch_k8s(args) -> int:
    from recipeforge.backends.k8s import K8sApi, K8sOptions, k8s_manifests, parse_api, render_documents
    from recipeforge.backends.slurm import SIGNAL_LEAD_S

    options = K8sOptions(image=args.image or "", pvc=args.pvc or "", namespace=args.namespace,
                         api=parse_api(args.k8s_api) if args.k8s_api is not None else K8sApi.TRAINJOB,
                         grace_period=SIGNAL_LEAD_S if args.grace_period is None else args.grace_period,
                         port=args.master_port or K8sOptions.port)
    manifests = k8s_manifests(_load(args), recipe=args.recipe, options=options,
                              nproc_per_node=args.nproc_per_node)
    for warning in manifests.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    _write(render_documents(manifests.documents, args.recipe), args.output)
    if args.output:
        print(f"Kubernetes manifests written to {args.output}\napply them with: kubectl apply -f "
              f"{shlex.quote(args.output)}")
    return 0


def cmd_preprocess(args) -> int:
    from recipeforge.run import preprocess

    loaded = _load(args)
    if getattr(args, "owns_process", False):
        _freeze_start_up()
    stats = preprocess(loaded)
    print(json.dumps(stats, indent=2, default=str))
    return 0


def cmd_convert_checkpoint(args) -> int:
    from pathlib import Path

    from recipeforge.errors import RecipeError

    if args.tensor_parallel < 1:
        raise RecipeError(f"--tensor-parallel must be 1 or more (got {args.tensor_parallel})")
    if args.output is None and (args.to_hf or args.tensor_parallel != 1):
        raise RecipeError("--to-hf and --tensor-parallel write into a folder of your choice: add -o DIR",
                          hint="without -o the model is converted at tensor parallel 1 into the cache")
    recipe = _load(args).recipe
    from recipeforge.backends import megatron_convert as convert

    if args.to_hf:
        out = convert.convert_to_hf(recipe, Path(args.to_hf), Path(args.output), tensor_parallel=args.tensor_parallel)
        print(f"Hugging Face checkpoint: {out}")
    elif args.output:
        out = convert.convert_to_megatron(recipe, Path(args.output), tensor_parallel=args.tensor_parallel)
        print(f"Megatron checkpoint: {out}")
    else:
        out = convert.import_checkpoint(recipe)
        print(f"Megatron checkpoint: {out}")
    return 0


def cmd_merge(args) -> int:
    from pathlib import Path

    from recipeforge.run import merge

    out = merge(Path(args.run_dir), Path(args.output) if args.output else None)
    print(f"merged model written to {out}")
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

    from recipeforge.outputs import library_warnings
    from recipeforge.outputs.exporters import export_run

    # Library noise (loading bars, deprecations) goes to the run's logs/warnings.log, as in training.
    library_warnings.route_library_warnings(0)
    try:
        if (Path(args.run_dir) / "final").is_dir():
            library_warnings.warnings_to_run_dir(Path(args.run_dir))
        result = export_run(Path(args.run_dir), args.format, Path(args.output) if args.output else None,
                            overwrite=args.overwrite, check=not args.no_check,
                            log=lambda m: print(f"[recipeforge] {m}", file=sys.stderr))
    finally:
        library_warnings.stop_routing()
    print(f"{args.format} export written to {result.out} in {result.seconds:.1f}s")
    if result.check is None:
        return 0
    print(result.check.line())
    return 0 if result.check.passed else EXIT_CHECK_FAILED


def cmd_chat(args) -> int:
    from pathlib import Path

    from recipeforge.outputs.chat import Sampling, chat, load_chat_model

    if args.max_new_tokens < 1 or args.temperature < 0:
        raise RecipeError("--max-new-tokens must be 1 or more and --temperature 0 or more",
                          hint="e.g. --max-new-tokens 256 --temperature 0.7 (0: greedy)")
    try:
        import readline  # noqa: F401  line editing and history for input() on a terminal
    except ImportError:
        pass
    # Bytes that are not text (a binary file piped in, a terminal in another encoding) become U+FFFD
    # instead of ending the chat with a decoding error.
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")
    from recipeforge.outputs import library_warnings

    run_dir = Path(args.run_dir)
    # Library noise (loading bars, deprecations) goes to the run's logs/warnings.log, as in training.
    library_warnings.route_library_warnings(0)
    try:
        if (run_dir / "final").is_dir():
            library_warnings.warnings_to_run_dir(run_dir)
        model, tokenizer = load_chat_model(run_dir, device=args.device)
        chat(model, tokenizer, system=args.system,
             sampling=Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature))
    finally:
        library_warnings.stop_routing()
    return 0


def cmd_serve(args) -> int:
    from pathlib import Path

    from recipeforge.outputs.serve_engines import serve

    if not 0 <= args.port <= 65535:
        raise RecipeError(f"--port {args.port} is not a port", hint="give 1-65535, or 0 for any free port")
    share = args.gpu_memory_utilization
    if share is not None and not 0 < share <= 1:
        raise RecipeError(f"--gpu-memory-utilization {share} is not a share", hint="give a fraction, e.g. 0.5")
    from recipeforge.outputs.serve_engines import api_key_from

    key, source = api_key_from(args.api_key)
    if source == "--api-key":
        print("warning: --api-key puts the key in the process list, where other users of this machine can read "
              "it; export RECIPEFORGE_API_KEY instead", file=sys.stderr)
    serve(Path(args.run_dir), engine=args.engine, host=args.host, port=args.port, name=args.name,
          api_key=key, device=args.device, memory_share=share, insecure=args.insecure)
    return 0


def cmd_eval(args) -> int:
    from recipeforge.outputs import library_warnings
    from recipeforge.outputs.evaluation.command import evaluate_targets
    from recipeforge.outputs.evaluation.results import comparison_table, format_score

    for flag in ("batch_size", "limit"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise RecipeError(f"--{flag.replace('_', '-')} must be 1 or more", key=f"--{flag.replace('_', '-')}")
    # Library noise (loading bars, deprecations) goes to logs/warnings.log of the first run, as in `chat`.
    library_warnings.route_library_warnings(0)
    try:
        first = Path(args.targets[0])
        if (first / "final").is_dir():
            library_warnings.warnings_to_run_dir(first)
        tasks = [t for arg in args.tasks or () for t in arg.split(",") if t]  # lm-eval's own --tasks a,b too
        done = evaluate_targets(args.targets, tasks=tasks, batch_size=args.batch_size, limit=args.limit,
                                device=args.device, checkpoints=args.checkpoints,
                                log=lambda m: print(f"[recipeforge] {m}", file=sys.stderr))
    finally:
        library_warnings.stop_routing()
    if len(done) > 1:
        sys.stdout.write(comparison_table([str(run) for run, _ in done], [subjects["final"] for _, subjects in done]))
        return 0
    run_dir, subjects = done[0]
    for subject, records in subjects.items():
        where = run_dir / "eval" if subject == "final" else run_dir / "eval" / subject
        for name, record in records.items():
            scores = ", ".join(f"{k} {format_score(v)}" for k, v in record["scores"].items())
            label = name if subject == "final" else f"{subject} {name}"
            print(f"{label}: {scores} ({record['samples']} examples) -> {where / (name + '.json')}")
    return 0


def cmd_push(args) -> int:
    from pathlib import Path

    from recipeforge.outputs.hub import push, push_plan, repo_from_run

    run_dir = Path(args.run_dir)
    repo_id, private = repo_from_run(run_dir)
    repo_id = args.repo_id or repo_id
    if args.dry_run:
        plan = push_plan(run_dir)
        print("\n".join(f"{dest}\t{src}" for src, dest in plan.files))
        return 0
    if not repo_id:
        raise RecipeError(f"no repository to push {run_dir} to", key="--repo-id",
                          hint="pass --repo-id my-org/my-model (or set output.push_to_hub.repo_id in the recipe)")
    url = push(run_dir, repo_id, private=private and not args.public,
               log=lambda m: print(f"[recipeforge] {m}", file=sys.stderr))
    print(f"pushed {run_dir} to {url}")
    return 0


def _write(text: str, path: str | None) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


# -- entry point ------------------------------------------------------------------------------------

GLOBAL_FLAGS = ("--debug", "--verbose", "--trust-code")


def _looks_like_override(arg: str) -> bool:
    """`key=value` or `~key`: an override, wherever it stands on the command line."""
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code.

    With the process's own command line (no `argv`: the `recipeforge` script, ``python -m recipeforge``),
    a command that runs a pipeline and prints its results (`preprocess`) owns the process: it freezes
    its start-up objects out of the garbage collector's way (`_freeze_start_up`) and ends the process
    itself once it succeeds (`_end_process`).
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may come after flags too (`train x.yaml --dry-run train.learning_rate=1e-4`); anything
    # else unknown is still an error.
    overrides = [a for a in extra if _looks_like_override(a)]
    if hasattr(args, "overrides") and overrides:
        args.overrides = [*args.overrides, *overrides]
        extra = [a for a in extra if a not in overrides]
    # The global flags also after the command (`recipeforge eval RUN --trust-code`), where a hint that
    # says "pass --trust-code" leads the user to type them.
    for flag in GLOBAL_FLAGS:
        if flag in extra:
            setattr(args, flag[2:].replace("-", "_"), True)
            extra = [a for a in extra if a != flag]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = args.debug or os.environ.get("RECIPEFORGE_DEBUG", "") not in ("", "0")
    if args.verbose:  # read where a run starts routing warnings (launched workers inherit it)
        from recipeforge.outputs.console import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
    if args.trust_code:  # read by the recipe loader and by whatever imports user code later
        from recipeforge.registry import TRUST_ENV

        os.environ[TRUST_ENV] = "1"
    func: Callable | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USER_ERROR
    # A command run as the process itself (no argv) that asks for it owns the process: its start-up
    # objects are frozen (`_freeze_start_up`) and it ends the process when done (`_end_process`).
    args.owns_process = argv is None and getattr(args, "owns_process", False)
    if args.owns_process:
        import gc

        gc.disable()  # until `_freeze_start_up`: importing makes objects that live as long as the process
    try:
        if getattr(args, "cleans_up", False):  # SIGTERM ends these after their temporary folders are removed
            from recipeforge.outputs.ownership import stop_on_sigterm

            with stop_on_sigterm():
                code = func(args)
        else:
            code = func(args)
    except RecipeError as exc:
        if debug:
            raise
        loaded = getattr(args, "loaded", None)
        if loaded is not None:
            from recipeforge.errors import locate_problems

            exc = locate_problems(exc, loaded.tree.locate)
        from recipeforge.config.secrets import scrub

        print(f"error: {scrub(exc.render())}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        from recipeforge.outputs.ownership import Terminated

        if isinstance(exc, Terminated):  # SIGTERM during a command that cleans up after itself
            print("terminated (SIGTERM); temporary folders removed", file=sys.stderr)
            return 143
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal bug: short message, traceback with --debug
        if debug:
            raise
        from recipeforge.config.secrets import scrub
        from recipeforge.outputs.preflight import write_failure

        failure = write_failure(exc)  # a full disk, a read-only or forbidden path: the user's to fix
        if failure is not None:
            print(f"error: {scrub(failure.render())}", file=sys.stderr)
            return EXIT_USER_ERROR

        from recipeforge.backends.peer_loss import lost_peer_message

        lost = lost_peer_message(exc)  # a worker whose peer died: the launcher reports the cause
        if lost is not None:
            print(f"error: {scrub(lost)}", file=sys.stderr)
            return EXIT_INTERNAL_ERROR
        from recipeforge.errors import bounded_text

        print(f"internal error: {type(exc).__name__}: {bounded_text(scrub(str(exc)))}\n(rerun with --debug for the traceback, "
              f"and please report it)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    if args.owns_process and code == 0:
        _end_process(code)
    return code


def _freeze_start_up() -> None:
    """Import what preprocessing runs on (transformers' tokenizer classes, datasets), then freeze every
    object made so far, and turn the garbage collector back on (`main` turned it off).

    The ~250k objects of those libraries' modules live until the process ends, yet each full collection
    walked them all again: ~0.15 s while importing and ~0.3 s while tokenizing 20k rows. Frozen, they are
    never examined (nor collected: only for a process the command owns); forked workers then share
    their pages instead of copying them when a collection would touch them.
    """
    import gc

    try:
        import datasets  # noqa: F401
        from transformers import PreTrainedTokenizerFast  # noqa: F401
    except ImportError:  # the command itself says what is missing
        pass
    gc.freeze()
    gc.enable()


def _end_process(code: int) -> None:
    """End the process with `code` as a normal exit does, less the teardown of the interpreter.

    Freeing every module and object of transformers, datasets and pyarrow takes ~0.2 s at exit and
    does nothing for results already written and printed. The atexit handlers run (logging,
    multiprocessing, temporary folders, any the caller registered) and the output is flushed, as at
    any exit. While a non-daemon thread runs, this returns and the process exits the usual way,
    waiting for it.
    """
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
