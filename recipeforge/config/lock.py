"""The `lock:` section: what a recipe was resolved against, and how this machine differs from it.

`build_lock` reads package versions with importlib.metadata (nothing heavy is imported), the model's
revision (a commit hash from the local Hugging Face cache, never the network), content hashes of
local models and data files, and the hardware a plan was made for (given as data, so this module
stays below the planner). `lock_differences` names each difference in one line.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from recipeforge import __version__

LOCKED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "recipeforge")
# Keys of the plan's hardware kept in a lock: where and how the recipe was planned to run.
HARDWARE_KEYS = ("nodes", "gpus_per_node", "gpu", "backend", "world_size")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def package_versions() -> dict[str, str | None]:
    """Installed version of each locked distribution (None when it is not installed)."""
    out: dict[str, str | None] = {}
    for name in LOCKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def plan_hardware(plan) -> dict[str, Any]:
    """The part of a `Plan` a lock keeps (the target machine and the process layout)."""
    hw = plan.extra.hardware or {}
    accelerator = hw.get("accelerator")
    gpu = accelerator.get("name") if isinstance(accelerator, dict) else accelerator
    return {"nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node, "gpu": gpu if plan.gpus_per_node else "cpu",
            "backend": plan.backend, "world_size": plan.world_size}


def hub_commit(repo_id: str, revision: str | None, repo_type: str = "model") -> str | None:
    """The commit `revision` (default main) of `repo_id` points to in the local hub cache, or None.

    Reads the cache's refs/ files only: no network, and no download of anything missing."""
    if revision and _COMMIT.match(revision):
        return revision
    try:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name
    except ImportError:
        return None
    try:
        folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    except ValueError:  # not a hub id (a URL, a path that does not exist): nothing cached under it
        return None
    ref = folder / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if _COMMIT.match(commit) else None


def model_lock(loaded) -> dict[str, Any]:
    """The model's pinned revision: tiny spec hash, local content hash, or hub commit from the cache."""
    from recipeforge.components.fingerprint import file_digest
    from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch

    model = loaded.recipe.model
    name = model.name_or_path
    arch = tiny_arch(name)
    if arch is not None:
        spec = json.dumps(TINY_CONFIGS.get(arch, {"unknown": arch}), sort_keys=True)
        return {"name_or_path": name, "revision": "spec:" + hashlib.sha256(spec.encode()).hexdigest()[:16],
                "source": "tiny", "note": None}
    local = _local(name, loaded)
    if local is not None:
        return {"name_or_path": name, "revision": "sha256:" + file_digest(local), "source": "local", "note": None}
    commit = hub_commit(name, model.revision)
    if commit is not None:
        return {"name_or_path": name, "revision": commit, "source": "hub-cache", "note": None}
    return {"name_or_path": name, "revision": model.revision or "main", "source": "requested",
            "note": "not in the local Hugging Face cache; the revision is as requested, not a commit hash"}


def dataset_locks(loaded) -> list[dict[str, Any]]:
    """A fingerprint per dataset entry: content hash of local data, `id@commit` (or `id@revision`) for the hub."""
    from recipeforge.components.data import DatasetRef, local_path, spec_base_dir
    from recipeforge.components.fingerprint import file_digest

    base = Path(loaded.path).resolve().parent
    out = []
    for section in ("datasets", "eval_datasets"):
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            ref = DatasetRef(spec, section, i)
            found = local_path(spec.path, spec_base_dir(ref, base, loaded.tree.locate))
            if found is not None:
                fingerprint, source = "sha256:" + file_digest(found), "local"
            else:
                commit = hub_commit(spec.path, None, repo_type="dataset")
                fingerprint = f"{spec.path}@{commit or 'main'}"
                source = "hub-cache" if commit else "requested"
            out.append({"key": ref.key, "path": spec.path, "fingerprint": fingerprint, "source": source})
    return out


def build_lock(loaded, hardware: dict[str, Any]) -> dict[str, Any]:
    """The `lock:` section for `loaded` (a `LoadedRecipe`) planned on `hardware` (see `plan_hardware`).

    Names and paths are written as the resolved recipe shows them: a value read from a secret
    environment variable, or a URL with a password, is redacted here too."""
    from recipeforge.config.dump import resolved_data
    from recipeforge.config.secrets import redact_literals

    shown = resolved_data(loaded)
    model = model_lock(loaded)
    model["name_or_path"] = shown["model"]["name_or_path"]
    datasets = dataset_locks(loaded)
    for entry in datasets:
        section, _, index = entry["key"][len("data."):].partition("[")
        raw, entry["path"] = entry["path"], shown["data"][section][int(index.rstrip("]"))]["path"]
        if entry["source"] != "local":
            entry["fingerprint"] = entry["path"] + entry["fingerprint"][len(raw):]
    lock = {"recipeforge": __version__, "packages": package_versions(), "model": model,
            "datasets": datasets, "hardware": {k: hardware.get(k) for k in HARDWARE_KEYS}}
    return redact_literals(lock)


def lock_differences(locked: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """One line per way this environment (`here`) differs from the `locked` section, e.g.
    ``package torch: 2.13.0 here, 2.12.0 locked``."""
    lines = []
    for name in sorted(set(locked.get("packages", {})) | set(here.get("packages", {}))):
        a, b = here.get("packages", {}).get(name), locked.get("packages", {}).get(name)
        if a != b and name in locked.get("packages", {}):
            lines.append(f"package {name}: {_v(a)} here, {_v(b)} locked")
    lm, hm = locked.get("model") or {}, here.get("model") or {}
    if (lm.get("name_or_path"), lm.get("revision")) != (hm.get("name_or_path"), hm.get("revision")):
        lines.append(f"model: {hm.get('name_or_path')}@{hm.get('revision')} here, "
                     f"{lm.get('name_or_path')}@{lm.get('revision')} locked")
    ld = {d["key"]: d for d in locked.get("datasets", ())}
    hd = {d["key"]: d for d in here.get("datasets", ())}
    for key in sorted(set(ld) | set(hd)):
        a, b = hd.get(key, {}).get("fingerprint"), ld.get(key, {}).get("fingerprint")
        if a != b:
            lines.append(f"dataset {key}: {_v(a)} here, {_v(b)} locked")
    for key in HARDWARE_KEYS:
        a, b = (here.get("hardware") or {}).get(key), (locked.get("hardware") or {}).get(key)
        if key in (locked.get("hardware") or {}) and a != b:
            lines.append(f"hardware {key}: {_v(a)} here, {_v(b)} locked")
    return lines


def _v(value: object) -> str:
    return "(none)" if value is None else str(value)


def _local(name: str, loaded) -> Path | None:
    """The local model directory `name` names (relative to the recipe's folder or the working directory)."""
    p = Path(name).expanduser()
    for candidate in ([p] if p.is_absolute() else [Path(loaded.path).resolve().parent / p, Path.cwd() / p]):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def check_lock(loaded, hardware: dict[str, Any], *, strict: bool, warn) -> list[str]:
    """Compare a locked recipe with this environment: `warn(line)` for each difference, or with
    `strict` refuse them all at once (a `RecipeError`, exit 2). Returns the differences."""
    from recipeforge.errors import RecipeError

    lock = loaded.recipe.lock
    if lock is None:
        return []
    differences = lock_differences(lock.model_dump(mode="json"), build_lock(loaded, hardware))
    if differences and strict:
        raise RecipeError("this environment differs from the recipe's lock:\n    " + "\n    ".join(differences),
                          key="lock", hint="install the locked versions, or run without --strict (it warns), or "
                                           "write a new lock with `recipeforge resolve --lock`")
    for line in differences:
        warn(f"warning: differs from the lock: {line}")
    return differences
