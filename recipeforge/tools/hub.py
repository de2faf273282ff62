"""Upload a finished run's model to the Hugging Face Hub (`output.push_to_hub`, `recipeforge push`).

What goes up: the model folder (``merged/`` when the run merged its adapter, else ``final/``) and the
run's model card (README.md) at the top of the repository. Never checkpoints, optimizer or scheduler
states, the run's logs, tracker files, environment.json or the run lock: `push_plan` lists exactly the
files, and the upload sends that list and nothing else.

The upload happens after the run is complete and saved, so a failed one loses nothing: `PushFailed`
carries a one-line reason and the command that retries (``recipeforge push RUN_DIR --repo-id ...``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from recipeforge.errors import RecipeError

# Files a model folder may hold that are training state, not the model.
NEVER = ("optimizer", "scheduler", "rng_state", "training_args.bin", "trainer_state.json", "scaler.pt")


class PushFailed(RecipeError):
    """The upload did not happen (offline, no token, unreachable or refusing endpoint); the run on
    disk is complete."""


@dataclass(frozen=True)
class PushPlan:
    """What `push` uploads: (local file, path in the repository) pairs, from `source` (a model folder)."""

    run_dir: Path
    source: Path
    files: tuple[tuple[Path, str], ...]
    notes: tuple[str, ...] = ()

    def paths_in_repo(self) -> list[str]:
        return [dest for _, dest in self.files]


def push_plan(run_dir: Path, *, merged: bool | None = None) -> PushPlan:
    """The files a push of `run_dir` uploads. `merged`: push merged/ (default: when the run's recipe
    set output.merge_adapter and merged/ exists)."""
    run_dir = Path(run_dir)
    recipe = _recipe(run_dir)
    if merged is None:
        merged = bool(_section(recipe, "output").get("merge_adapter")) and (run_dir / "merged").is_dir()
    source = run_dir / ("merged" if merged else "final")
    if not source.is_dir():
        raise RecipeError(f"{run_dir} has no {source.name}/ model to push",
                          hint="push a run that finished (`recipeforge train` writes final/; "
                               "output.merge_adapter writes merged/)")
    files: list[tuple[Path, str]] = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source).as_posix()
        if any(part.startswith(".") for part in Path(rel).parts) or rel.startswith(NEVER) \
                or Path(rel).name.startswith(NEVER) or rel == "README.md":
            continue  # hidden files (locks, staging), training state, the library's own card
        files.append((path, rel))
    card = run_dir / "README.md"
    if card.is_file():
        files.append((card, "README.md"))
        plot = run_dir / "loss.png"
        if plot.is_file():  # the card shows it by a relative link
            files.append((plot, "loss.png"))
    notes = []
    adapter = source / "adapter_config.json"
    if adapter.is_file():
        from recipeforge.outputs.model_files import read_json_file

        base = read_json_file(adapter, what="adapter config").get("base_model_name_or_path") or ""
        if isinstance(base, str) and base and Path(base).is_absolute():
            notes.append(f"the adapter's base model is the local folder {base}; set output.merge_adapter: true "
                         f"to push a model that loads on its own")
    return PushPlan(run_dir, source, tuple(files), tuple(notes))


def push(run_dir: Path, repo_id: str, *, private: bool = True, merged: bool | None = None, log=print) -> str:
    """Upload `push_plan(run_dir)` to the model repository `repo_id` (created when missing, private by
    default); returns the repository URL. Raises `PushFailed` with a one-line reason otherwise."""
    plan = push_plan(run_dir, merged=merged)
    retry = retry_command(run_dir, repo_id)
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise PushFailed(f"cannot push to the Hub: offline mode is on (HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']})",
                         hint=f"the run is complete on disk; unset HF_HUB_OFFLINE, then retry: {retry}")
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    token = get_token()
    if not token:
        raise PushFailed("cannot push to the Hub: no Hugging Face token",
                         hint=f"the run is complete on disk; run `hf auth login` or set HF_TOKEN, then retry: {retry}")
    api = HfApi(token=token)
    for note in plan.notes:
        log(f"note: {note}")
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        ops = [CommitOperationAdd(path_in_repo=dest, path_or_fileobj=str(src)) for src, dest in plan.files]
        api.create_commit(repo_id, ops, commit_message=f"Upload {plan.source.name}/ of {plan.run_dir.name} "
                                                        f"(recipeforge)", repo_type="model")
    except Exception as exc:  # HTTP errors, refused connections, offline mode, bad repo ids
        raise PushFailed(f"pushing {plan.source} to {repo_id} failed: {_one_line(exc)}",
                         hint=f"the run is complete on disk; check the endpoint and the token, then retry: {retry}") from None
    return str(url)


def retry_command(run_dir: Path, repo_id: str | None) -> str:
    return shlex.join(["recipeforge", "push", str(run_dir), *(["--repo-id", repo_id] if repo_id else [])])


def repo_from_run(run_dir: Path) -> tuple[str | None, bool]:
    """`output.push_to_hub` (repo id, private) of the run's resolved recipe; (None, True) without one."""
    hub = _section(_recipe(Path(run_dir)), "output").get("push_to_hub")
    hub = hub if isinstance(hub, dict) else {}
    repo = hub.get("repo_id")
    return (repo if isinstance(repo, str) and repo else None), hub.get("private", True) is not False


def _recipe(run_dir: Path) -> dict:
    import yaml

    path = run_dir / "resolved_recipe.yaml"
    if not run_dir.is_dir():
        raise RecipeError(f"{run_dir} is not a run directory", hint="pass the output.dir of a finished run")
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError, RecursionError):  # damaged: as if there were none
        data = {}
    return data if isinstance(data, dict) else {}


def _section(recipe: dict, name: str) -> dict:
    """A section of a run's resolved recipe, {} when it is missing or not a mapping (a damaged file)."""
    value = recipe.get(name)
    return value if isinstance(value, dict) else {}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
