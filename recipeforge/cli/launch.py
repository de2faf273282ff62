"""The command launch: a recipe as a cluster job, an sbatch script (--slurm) or Kubernetes manifests (--k8s),
or trained on a Ray cluster (--ray). Writing the job imports neither torch nor transformers."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from recipeforge.cli.common import hardware_overrides, load, recipe_args, worker_flags, write_output
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers

# `launch` flags that belong to one scheduler, by flag and argparse dest: given with the other, they are refused.
SLURM_FLAGS = {"--partition": "partition", "--account": "account", "--time": "time", "--qos": "qos",
               "--cpus-per-task": "cpus_per_task", "--sbatch-option": "sbatch_option"}
K8S_FLAGS = {"--image": "image", "--pvc": "pvc", "--k8s-api": "k8s_api", "--namespace": "namespace",
             "--grace-period": "grace_period"}
RAY_FLAGS = {"--ray-address": "ray_address", "--overwrite": "overwrite", "--force": "force", "--dry-run": "dry_run"}


def add_launch(sub: Subparsers) -> None:
    p = sub.add_parser("launch", help="write a cluster job for a recipe: an sbatch script (Slurm) or "
                                      "Kubernetes manifests (Kubeflow TrainJob or PyTorchJob); or run it on a "
                                      "Ray cluster (Ray Train)")
    recipe_args(p)
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


def cmd_launch(args: argparse.Namespace) -> int:
    check_scheduler_flags(args)
    if args.k8s:
        return launch_k8s(args)
    if args.ray:
        return launch_ray(args)
    return launch_slurm(args)


def check_scheduler_flags(args: argparse.Namespace) -> None:
    """A flag of one launch target (--slurm, --k8s, --ray) given with another is a mistake worth saying."""
    mode = "--k8s" if args.k8s else "--ray" if args.ray else "--slurm"
    other = {"--slurm": {**K8S_FLAGS, **RAY_FLAGS}, "--k8s": {**SLURM_FLAGS, **RAY_FLAGS},
             "--ray": {**SLURM_FLAGS, **K8S_FLAGS}}[mode]
    given = [flag for flag, dest in other.items() if getattr(args, dest) not in (None, [], False)]
    if given:
        owner = {**{f: "--slurm" for f in SLURM_FLAGS}, **{f: "--k8s" for f in K8S_FLAGS}, **{f: "--ray" for f in RAY_FLAGS}}
        raise RecipeError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for launch "
                          f"{owner[given[0]]} only, not {mode}")


def launch_slurm(args: argparse.Namespace) -> int:
    """`launch --slurm`: an sbatch script that runs one `recipeforge train` per node."""
    from recipeforge.backends.slurm import SlurmOptions, write_sbatch

    options = SlurmOptions(partition=args.partition, account=args.account, time=args.time,
                           cpus_per_task=args.cpus_per_task, qos=args.qos, extra=tuple(args.sbatch_option))
    # Each node's `recipeforge train` plans for the same hardware the script was planned for.
    overrides = [*args.overrides, *hardware_overrides(args)]
    path = write_sbatch(load(args), recipe=args.recipe, overrides=overrides, options=options,
                        nproc_per_node=args.nproc_per_node, port=args.master_port,
                        output=args.output)
    print(f"sbatch script written to {path}\nsubmit it with: sbatch {shlex.quote(str(path))}")
    return 0


def launch_ray(args: argparse.Namespace) -> int:
    """`launch --ray`: `train` with its workers started by Ray Train on a Ray cluster, in the foreground
    (exit codes as `train`'s: 0, 2, 75, 1)."""
    from recipeforge.backends.ray_launch import check_ray_installed
    from recipeforge.cli.train import run_training
    from recipeforge.run import LaunchOptions

    given = [flag for flag, value in (("-o/--output", args.output), ("--master-port", args.master_port)) if value]
    if given:  # Ray sets up the workers' rendezvous, and the run directory is what the launch writes
        raise RecipeError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for launch --slurm and --k8s, "
                          "not --ray")
    if not args.dry_run:
        check_ray_installed()  # before planning: a short error without Ray
    args.overrides = [*args.overrides, *hardware_overrides(args)]  # the workers plan nothing; they load the same
    loaded = load(args)
    opts = LaunchOptions(recipe_path=args.recipe, overrides=tuple(args.overrides), nproc_per_node=args.nproc_per_node,
                         dry_run=args.dry_run, ray=True, ray_address=args.ray_address, **worker_flags(args))
    return run_training(args, loaded, opts)


def launch_k8s(args: argparse.Namespace) -> int:
    """`launch --k8s`: a ConfigMap with the resolved recipe and a job of one launcher per pod."""
    from recipeforge.backends.k8s import K8sApi, K8sOptions, k8s_manifests, parse_api, render_documents
    from recipeforge.backends.slurm import SIGNAL_LEAD_S

    options = K8sOptions(image=args.image or "", pvc=args.pvc or "", namespace=args.namespace,
                         api=parse_api(args.k8s_api) if args.k8s_api is not None else K8sApi.TRAINJOB,
                         grace_period=SIGNAL_LEAD_S if args.grace_period is None else args.grace_period,
                         port=args.master_port or K8sOptions.port)
    manifests = k8s_manifests(load(args), recipe=args.recipe, options=options,
                              nproc_per_node=args.nproc_per_node)
    for warning in manifests.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    write_output(render_documents(manifests.documents, args.recipe), args.output)
    if args.output:
        print(f"Kubernetes manifests written to {args.output}\napply them with: kubectl apply -f "
              f"{shlex.quote(args.output)}")
    return 0
