"""What is done with a finished run from Python: its LoRA adapter merged, its main metrics summed up."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def merge(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Merge the LoRA adapter of a finished run into its base model (safetensors); returns the folder
    (default ``RUN_DIR/merged``)."""
    from recipeforge.outputs.merge import merge_adapter
    from recipeforge.outputs.preflight import output_write_failure

    try:
        return merge_adapter(Path(run_dir), Path(out_dir) if out_dir is not None else None)
    except Exception as exc:  # a full disk, a read-only mount: said about the merged folder and its disk
        failure = output_write_failure(exc, Path(out_dir) if out_dir is not None else Path(run_dir) / "merged",
                                       what="the merged model")
        if failure is None:
            raise
        raise failure from None


def summary(run_dir: Path) -> dict[str, Any]:
    """First and last value of the main metrics of a finished run (for the CLI to print)."""
    from recipeforge.outputs.metrics import read_metrics, series
    from recipeforge.stage_specs import REPORTED_METRICS

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    out = {}
    for key in REPORTED_METRICS:
        values = series(records, key)
        if values:
            out[key] = {"first": values[0], "last": values[-1]}
    return out
