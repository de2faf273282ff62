"""`recipeforge export RUN_DIR --format FMT`: a finished run's model in a format serving engines load.

One module per job: `formats` (the fixed set of formats, what each needs, its self-check bound),
`source` (the run's weights, a LoRA adapter merged first, and the output folder's rules), `writers`
(a copy, or torchao quantization), `selfcheck` (the export loaded back against the unquantized
model) and `readme` (how to load it). torch and transformers are imported inside the functions that
use them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recipeforge.tools.exporters.formats import FORMATS, GROUPED_INT4, FormatSpec, check_available, format_spec
from recipeforge.tools.exporters.selfcheck import CheckResult

__all__ = ["FORMATS", "ExportFormat", "ExportResult", "export_run", "default_output"]

EXPORT_RECORD = "export.json"


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, how long it took, and its self-check (None when skipped)."""

    out: Path
    seconds: float
    check: CheckResult | None


def default_output(run_dir: Path, fmt: str) -> Path:
    """RUN_DIR/export-FMT: where an export goes without -o."""
    return Path(run_dir) / f"export-{fmt}"


def export_run(run_dir: Path, fmt: str, out: Path | None = None, *, overwrite: bool = False, check: bool = True,
               log: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export the model of `run_dir` in format `fmt` to `out` (default RUN_DIR/export-FMT), with a
    README.md and export.json, and check it against the unquantized model unless `check` is False.

    Every refusal (no final/ model, an unknown or unavailable format, an output folder that holds
    files without `overwrite`) is a `RecipeError` raised before anything is written; the folder is
    written beside `out` and takes its place only when complete."""
    from recipeforge.outputs.weights import staged_folder
    from recipeforge.tools.exporters.source import check_output, check_run_dir, full_weights

    spec = format_spec(fmt)
    run_dir = Path(run_dir)
    check_available(spec, str(run_dir))
    check_run_dir(run_dir)
    out = Path(out) if out is not None else default_output(run_dir, spec.name.value)
    check_output(run_dir, out, overwrite=overwrite)
    from recipeforge import start_up
    from recipeforge.outputs.preflight import output_write_failure

    start_up.resume(*start_up.MODEL_LOADING)  # the models are made with the collector on
    started = time.perf_counter()
    try:
        with staged_folder(out, kind="export") as tmp:
            with full_weights(run_dir, scratch=out.parent, log=log) as src:
                log(f"writing {spec.name} of {run_dir}")
                settings = _write(spec, src, tmp, run_dir, log)
            written = time.perf_counter() - started
            result = _self_check(run_dir, tmp, spec, log) if check else None
            seconds = time.perf_counter() - started
            _records(spec, run_dir=run_dir, out=out, tmp=tmp, settings=settings, check=result,
                     seconds={"write": round(written, 3), "total": round(seconds, 3)})
    except Exception as exc:  # a full disk, a read-only mount: said about the export's folder and its disk
        failure = output_write_failure(exc, out, what="the export")
        if failure is None:
            raise
        raise failure from None
    return ExportResult(out=out, seconds=seconds, check=result)


def _write(spec: FormatSpec, src: Path, dest: Path, run_dir: Path, log: Callable[[str], None]) -> dict:
    from recipeforge.components.qat import export_format
    from recipeforge.tools.exporters.writers import qat_settings, write_export

    # int4 in the groups a quantization-aware run trained for (train.qat.group_size)
    qat = qat_settings(run_dir) if spec.name in GROUPED_INT4 else None
    settings = write_export(spec, src, dest, group=qat[1] if qat else None)
    if qat is not None and export_format(qat[0]) != spec.name.value:
        # the groups match, but the run simulated another quantization than this format's
        meant = export_format(qat[0])
        log(f"note: this run trained quantization-aware for {meant} (train.qat.scheme {qat[0]}); "
            f"--format {meant} is the export it simulates")
        settings["trained_for"] = meant
    return settings


def _self_check(run_dir: Path, export_dir: Path, spec: FormatSpec, log: Callable[[str], None]) -> CheckResult:
    """The export loaded back by transformers against the run's model as trained (final/, an adapter
    on its base), on the CPU: the same device for both, so only the format makes a difference."""
    from transformers import AutoModelForCausalLM

    from recipeforge.tools.chat import load_chat_model
    from recipeforge.tools.exporters.selfcheck import compare, held_texts, measure

    log("checking the export against the unquantized model (loaded back with transformers)")
    reference, tokenizer = load_chat_model(run_dir, device="cpu")
    texts, texts_from = held_texts(run_dir, tokenizer)
    before = measure(reference, tokenizer, texts)
    del reference
    exported = AutoModelForCausalLM.from_pretrained(str(export_dir), dtype="auto").eval()
    return compare(before, measure(exported, tokenizer, texts), bound=spec.max_ppl_change, texts_from=texts_from)


def _records(spec: FormatSpec, *, run_dir: Path, out: Path, tmp: Path, settings: dict, check: CheckResult | None,
             seconds: dict) -> None:
    """export.json (the numbers) and README.md (how to load it) in the folder being written."""
    from recipeforge import __version__
    from recipeforge.tools.exporters.readme import render_readme

    checked = check.to_dict() if check is not None else None
    record = {"format": spec.name.value, "run_dir": str(run_dir), "settings": settings, "seconds": seconds,
              "self_check": checked, "recipeforge": __version__,
              "bytes": sum(p.stat().st_size for p in tmp.iterdir() if p.suffix == ".safetensors")}
    (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    (tmp / "README.md").write_text(render_readme(spec, run_dir=run_dir, out=out, settings=settings, check=checked))
