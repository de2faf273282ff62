"""The run directory: one folder per run holding everything needed to understand and repeat it.

    resolved_recipe.yaml   the recipe after extends/overrides/interpolation
    plan.json              the planner's decisions and reasons
    recipe.lock.yaml       the resolved recipe with a `lock:` section (versions, revisions, data hashes)
    environment.json       package versions, platform, git commit
    metrics.jsonl          every logged metric, one JSON object per line
    checkpoints/           complete checkpoints (resume picks the newest)
    final/                 the trained model (safetensors, or the adapter) and tokenizer
    merged/                base + adapter merged (when output.merge_adapter)
    base_model/            the random-init base of a tiny model trained with an adapter
    README.md              model card embedding the recipe
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

from recipeforge.errors import RecipeError

PACKAGES = ("recipeforge", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers",
            "safetensors", "bitsandbytes", "deepspeed", "flash-attn", "liger-kernel", "vllm", "wandb", "tensorboard")


@dataclass(frozen=True)
class RunDir:
    """Paths of a run directory."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def merged(self) -> Path:
        return self.root / "merged"

    @property
    def base_model(self) -> Path:
        return self.root / "base_model"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def resolved_recipe(self) -> Path:
        return self.root / "resolved_recipe.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def lock(self) -> Path:
        return self.root / "recipe.lock.yaml"

    @property
    def environment(self) -> Path:
        return self.root / "environment.json"

    @property
    def readme(self) -> Path:
        return self.root / "README.md"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def rollout_server(self) -> Path:
        """Where a generation server the run started answers (GRPO server mode)."""
        return self.root / "rollout_server.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def has_results(self) -> bool:
        """Whether an earlier run left a model or checkpoints here."""
        return self.final.exists() or (self.checkpoints.exists() and any(self.checkpoints.iterdir()))

    def reset(self) -> None:
        """Remove everything a previous run wrote (`--overwrite`): only a folder recipeforge wrote, never
        the root, the home or working directory (`ownership.remove_owned`)."""
        from recipeforge.outputs.ownership import remove_owned

        remove_owned(self.root)

    def write_recipe(self, tree_data: dict, source: Path | None = None) -> None:
        """resolved_recipe.yaml: the recipe as run, headed by its source and its hash (see run_guard)."""
        from recipeforge.outputs.run_guard import HASH_HEADER, recipe_hash

        header = (f"# Resolved from {source}\n" if source else "") + f"{HASH_HEADER}{recipe_hash(tree_data)}\n"
        text = yaml.safe_dump(tree_data, sort_keys=False, allow_unicode=True)
        _atomic_write(self.resolved_recipe, header + text)

    def write_lock(self, locked_data: dict, source: Path | None = None) -> None:
        """recipe.lock.yaml: the recipe as run plus the `lock:` of this environment (`recipeforge diff`
        and `train --strict` read it)."""
        header = f"# Locked from {source} by recipeforge train\n" if source else ""
        _atomic_write(self.lock, header + yaml.safe_dump(locked_data, sort_keys=False, allow_unicode=True))

    def write_plan(self, plan) -> None:
        _atomic_write(self.plan, json.dumps(plan.to_dict(), indent=2, default=str) + "\n")

    def write_rollout_server(self, url: str, **details) -> None:
        _atomic_write(self.rollout_server, json.dumps({"url": url, **details}, indent=2, default=str) + "\n")

    def write_environment(self, extra: dict | None = None) -> None:
        info = environment_info()
        if extra:
            info.update(extra)
        _atomic_write(self.environment, json.dumps(info, indent=2, default=str) + "\n")


def default_run_dir(recipe, recipe_path: Path | None) -> Path:
    """`output.dir`, or ``runs/<recipe file stem>`` below the working directory."""
    if recipe.output.dir:
        return Path(recipe.output.dir).expanduser()
    stem = recipe_path.stem if recipe_path is not None else (recipe.name or recipe.stage)
    return Path("runs") / stem


def prepare(run: RunDir, *, overwrite: bool, resume: str) -> None:
    """Create the run directory, or decide what to do with an existing one.

    `--overwrite` wipes it. Otherwise an existing run is only continued (resume auto or a path);
    `resume: never` on a directory with results is refused rather than silently mixed.
    """
    if overwrite:
        run.reset()
    elif run.has_results() and resume == "never":
        raise RecipeError(f"run directory {run.root} already holds a run, and output.resume is 'never'",
                          key="output.resume",
                          hint="pass --overwrite to start over, choose another output.dir, or use resume: auto")
    run.root.mkdir(parents=True, exist_ok=True)
    from recipeforge.outputs.ownership import BOOKKEEPING, OWNER_FILE, is_owned, mark_owned

    # Marked as recipeforge's. A folder of the user's that a run was pointed at keeps the names of what it
    # held: --overwrite will not delete it while they are there.
    if not (run.root / OWNER_FILE).exists():
        before = [] if is_owned(run.root) else [p.name for p in run.root.iterdir() if p.name not in BOOKKEEPING]
        mark_owned(run.root, "run", foreign=before)


def environment_info() -> dict:
    """Versions and machine facts that decide whether a run can be repeated."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    info = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "git": _git_info(Path.cwd()),
        "recipeforge_git": _git_info(Path(__file__).resolve().parents[2]),
    }
    try:
        import torch

        info["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def _git_info(path: Path) -> dict | None:
    """Commit and dirtiness of the git checkout containing `path`, if any (no network involved)."""
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return None


def _atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, with any credential in it redacted (a token
    pasted into a description reaches plan.json and the environment record as well)."""
    from recipeforge.credentials import redact_credentials

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(redact_credentials(text))
    os.replace(tmp, path)
