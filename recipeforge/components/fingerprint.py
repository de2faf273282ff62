"""Fingerprints of tokenized data: data file contents + tokenizer + every option that changes ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from recipeforge.components.data import DatasetRef, Locate, _no_location, local_path, spec_base_dir
from recipeforge.components.tokenizer import tokenizer_fingerprint

# Bump when the tokenization/packing code changes what it produces for the same inputs.
PIPELINE_VERSION = 3  # 3: chat replies are trained up to their turn-end token (generation blocks)


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, or of every file below a directory (names and contents)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    return h.hexdigest()


def data_fingerprint(recipe, tokenizer, *, base_dir: Path | None, locate: Locate = _no_location) -> str:
    """The cache key of a recipe's tokenized data."""
    data = recipe.data
    sources = []
    for section in ("datasets", "eval_datasets"):
        for i, spec in enumerate(getattr(data, section)):
            found = local_path(spec.path, spec_base_dir(DatasetRef(spec, section, i), base_dir, locate))
            # Hub datasets are keyed by name (their content is versioned by the hub, not by us).
            content = file_digest(found) if found is not None else f"hub:{spec.path}"
            sources.append({"section": section, "spec": spec.model_dump(mode="json"), "content": content})
    options = {
        "version": PIPELINE_VERSION,
        "stage": recipe.stage,
        "seed": recipe.train.seed,
        "data": data.model_dump(mode="json", exclude={"datasets", "eval_datasets", "cache_dir", "num_proc"}),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "eot_tokens": list(getattr(recipe.model, "eot_tokens", ())),  # where a reply's trained part ends
        "sources": sources,
    }
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:20]
