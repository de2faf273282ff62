"""Checkpoint manifests: what a published checkpoint held, so a damaged one is recognised before resuming.

When a checkpoint is published (`atomic.py`), rank 0 lists every file below it with its relative path,
size and a hash, and writes that list atomically as ``checkpoint_manifest.json`` before the completeness
marker. On resume the files are checked against it; the first mismatch is reported by name.

The hash is BLAKE2b (``hashlib``, no extra package). Files up to `FULL_HASH_LIMIT` (256 MiB) are hashed
whole. Larger files (multi-GB weights and optimizer states) are hashed by sampling: their size plus the
first, the last and six evenly spaced 1 MiB blocks (``blake2b-sampled``), so publishing and resuming
cost seconds rather than minutes per checkpoint. Sampling catches every truncation or extension (the
size), a file replaced by another one or rewritten from its start or end, and a zero-filled tail; it can
miss a change confined to the unsampled middle of a large file (a storage-level bit flip), which only the
filesystem's own checksums can promise to catch.

Checkpoints published before manifests existed (a marker without one) are checked for what can be
checked without one: the trainer state parses, weights are present, no file is empty, and every
``*.safetensors`` file is as long as its own header says.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

MANIFEST = "checkpoint_manifest.json"
FULL_HASH_LIMIT = 256 << 20
BLOCK = 1 << 20
SAMPLES = 6            # evenly spaced blocks between the first and the last one
FORMAT = 1


def file_hash(path: Path, size: int | None = None) -> tuple[str, str]:
    """(method, hex digest) of one file: whole-file BLAKE2b, or sampled for files over the limit."""
    size = path.stat().st_size if size is None else size
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        if size <= FULL_HASH_LIMIT:
            while block := fh.read(BLOCK):
                h.update(block)
            return "blake2b", h.hexdigest()
        h.update(struct.pack("<Q", size))
        step = (size - BLOCK) // (SAMPLES + 1)
        for offset in [0, *(step * i for i in range(1, SAMPLES + 1)), size - BLOCK]:
            fh.seek(offset)
            h.update(fh.read(BLOCK))
    return "blake2b-sampled", h.hexdigest()


def _files(directory: Path, skip: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and not (p.parent == directory and p.name in skip))


def build_manifest(directory: Path, *, skip: tuple[str, ...] = ()) -> dict:
    """The manifest of every file below `directory` (except the top-level names in `skip`)."""
    files = []
    for path in _files(directory, (MANIFEST, *skip)):
        size = path.stat().st_size
        method, digest = file_hash(path, size)
        files.append({"path": path.relative_to(directory).as_posix(), "size": size, "hash": digest,
                      "method": method})
    return {"format": FORMAT, "files": files}


def write_manifest(directory: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """Write ``checkpoint_manifest.json`` into `directory` atomically (temp file, fsync, rename)."""
    data = build_manifest(directory, skip=skip)
    target = directory / MANIFEST
    tmp = directory / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def verify(directory: Path, *, required_manifest: bool = False) -> list[str]:
    """Problems found in the checkpoint `directory` (empty when it verifies), each naming its file."""
    path = directory / MANIFEST
    if not path.is_file():
        if required_manifest:
            return [f"{MANIFEST}: missing (the checkpoint's completion marker names it)"]
        return verify_without_manifest(directory)
    try:
        data = json.loads(path.read_text())
        entries = data["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    problems = []
    for entry in entries:
        rel = entry.get("path", "?")
        file = directory / rel
        try:
            size = file.stat().st_size
        except OSError:
            problems.append(f"{rel}: missing")
            continue
        if size != entry.get("size"):
            problems.append(f"{rel}: {size} bytes, the manifest says {entry.get('size')}"
                            + (" (truncated)" if isinstance(entry.get("size"), int) and size < entry["size"] else ""))
            continue
        try:
            method, digest = file_hash(file, size)
        except OSError as exc:
            problems.append(f"{rel}: unreadable ({exc.strerror or exc})")
            continue
        if method != entry.get("method") or digest != entry.get("hash"):
            problems.append(f"{rel}: contents differ from the manifest ({method} hash)")
    return problems


WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "adapter_model.bin")


def verify_without_manifest(directory: Path) -> list[str]:
    """What can be checked of a checkpoint that has no manifest (written by an older version)."""
    problems = []
    try:
        json.loads((directory / "trainer_state.json").read_text())
    except FileNotFoundError:
        problems.append("trainer_state.json: missing")
    except (OSError, ValueError) as exc:
        problems.append(f"trainer_state.json: unreadable ({exc})")
    if not any((directory / f).is_file() for f in WEIGHT_FILES) and not any(directory.glob("global_step*")):
        problems.append("no weights: none of " + ", ".join(WEIGHT_FILES) + " or global_step*/ found")
    for file in _files(directory, ()):
        rel = file.relative_to(directory).as_posix()
        size = file.stat().st_size
        if size == 0:
            problems.append(f"{rel}: empty")
        elif file.suffix == ".safetensors":
            problem = safetensors_length_problem(file, size)
            if problem:
                problems.append(f"{rel}: {problem}")
    return problems


def safetensors_length_problem(path: Path, size: int) -> str | None:
    """Why a ``.safetensors`` file is not as long as its header says (None when it is): catches a
    truncated weights file without reading the tensors."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                return f"{size} bytes, the header alone claims {header_len + 8} (truncated)"
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as exc:
        return f"unreadable safetensors header ({exc})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    expected = 8 + header_len + end
    if size != expected:
        return f"{size} bytes, its header says {expected}" + (" (truncated)" if size < expected else "")
    return None
