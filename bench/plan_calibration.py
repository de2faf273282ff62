"""Calibration of the planner's memory model against published, measured peak-memory figures.

Every recipe under tests/plan/published/ reproduces one published fine-tuning run; its header names
the source and carries a ``# calibration: {published: X, unit: GiB, measure: M}`` line. Figures count
different things, so each is compared with the matching part of the estimate
(`recipeforge.plan.memory.measured_view`):

- ``allocated``: torch's max_memory_allocated / active (no allocator cache, no CUDA context);
- ``reserved``: torch's max_memory_reserved (the allocator's segments, no CUDA context);
- ``device``: what nvidia-smi shows (reserved + CUDA context and NCCL buffers).

    python bench/plan_calibration.py [--json | --markdown] [--set published | heldout]
    python bench/plan_calibration.py --bands | --write-bands

`--bands` prints each accuracy class's band measured from both sets (`bands`); `--write-bands` also
writes it to recipeforge/plan/accuracy_bands.py, which the planner reads.

`--set heldout` evaluates tests/plan/published_heldout/ instead: figures gathered the same way but
chosen (and written down) before the model was ever planned on them, and kept out of its fitting.
Without `--set`, the fitting set's table is followed by one summary line for each set; the held-out
line is the planner's accuracy (docs/planner.md).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "tests" / "plan" / "published"
HELDOUT = ROOT / "tests" / "plan" / "published_heldout"
SETS = {"published": PUBLISHED, "heldout": HELDOUT}
BAND = 0.15
GB = 1e9
GIB = 2 ** 30


@dataclass
class Row:
    name: str
    source: str
    setting: str
    published_gib: float
    measure: str
    estimate_gib: float | None      # None: the planner refused the recipe
    plan: str
    refusal: str = ""
    excluded: str = ""              # why the figure is reported but not aggregated
    band_class: str = ""            # the plan's accuracy class (`recipeforge.plan.accuracy.band_class`)

    @property
    def error(self) -> float | None:
        return None if self.estimate_gib is None else self.estimate_gib / self.published_gib - 1


def _header(path: Path) -> tuple[dict, str, str]:
    lines = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    meta = next(yaml.safe_load(line.split(":", 1)[1]) for line in lines if line.startswith("calibration:"))
    source = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("source:"))
    setting = ""
    for i, line in enumerate(lines):
        if line.startswith("setting:"):
            setting = line.split(":", 1)[1].strip()
            for more in lines[i + 1:]:
                if ":" in more.split(" ", 1)[0]:
                    break
                setting += " " + more
            break
    return meta, source, setting


def evaluate(paths=None, folder: Path | str | None = None) -> list[Row]:
    """Plan every published recipe on its own hardware and compare with the published figure.

    `paths`: the recipes to evaluate; else every recipe in `folder` (default: tests/plan/published/)."""
    from recipeforge.config import load_recipe
    from recipeforge.errors import RecipeError
    from recipeforge.plan import hardware_for, make_plan
    from recipeforge.plan.memory import measured_view

    rows = []
    for path in sorted(paths or Path(folder or PUBLISHED).glob("*.yaml")):
        meta, source, setting = _header(path)
        published = float(meta["published"]) * (GB / GIB if meta["unit"] == "GB" else 1.0)
        excluded = meta.get("excluded", "")
        try:
            recipe = load_recipe(str(path)).recipe
            plan = make_plan(recipe, hardware_for(recipe, None))
        except RecipeError as exc:
            estimate = _memory_model_only(path, meta["measure"]) if excluded else None
            rows.append(Row(path.stem, source, setting, published, meta["measure"], estimate,
                            "memory model only" if estimate is not None else "", str(exc), excluded))
            continue
        estimate = measured_view(plan.memory_gb, meta["measure"])
        label = plan.backend + (f" {plan.preset}" if plan.preset else "")
        rows.append(Row(path.stem, source, setting, published, meta["measure"], estimate,
                        f"{label}, micro {plan.micro_batch_size}, ckpt {'on' if plan.gradient_checkpointing else 'off'}",
                        excluded=excluded, band_class=plan.extra.accuracy_class))
    return rows


PERCENTILE = 0.90   # the band holds this share of a class's published figures
MIN_FIGURES = 8     # fewer figures than this measure no spread: the class counts as uncalibrated
BANDS_MODULE = ROOT / "recipeforge" / "plan" / "accuracy_bands.py"


def bands(rows: list[Row]) -> tuple[dict[str, float], dict[str, int]]:
    """Each accuracy class's band from its figures (excluded ones left out): the nearest-rank
    `PERCENTILE` of |published / estimate - 1|, the distance from the estimate to the measured peak
    as a share of the estimate (the band is drawn around the estimate), rounded up to a whole
    percent; and how many figures each band rests on."""
    spreads: dict[str, list[float]] = {}
    for r in rows:
        if not r.excluded and r.estimate_gib and r.band_class:
            spreads.setdefault(r.band_class, []).append(abs(r.published_gib / r.estimate_gib - 1))
    out, counts = {}, {}
    for name, values in sorted(spreads.items()):
        if len(values) < MIN_FIGURES:
            continue
        ranked = sorted(values)
        value = ranked[max(0, math.ceil(PERCENTILE * len(ranked)) - 1)]
        out[name], counts[name] = math.ceil(value * 100 - 1e-9) / 100, len(values)
    return out, counts


def bands_module(found: dict[str, float], counts: dict[str, int]) -> str:
    """The text of recipeforge/plan/accuracy_bands.py for `found` bands."""
    widest = max(found.values(), default=0.20)
    uncalibrated = max(0.25, math.ceil(widest * 100 + 5) / 100)
    return (f'''"""The accuracy band of each class of estimate (`recipeforge.plan.accuracy.band_class`): the
{PERCENTILE:.0%} nearest-rank percentile of |published / estimate - 1| over the published figures of that class
(tests/plan/published/ and published_heldout/, the excluded ones left out), rounded up to a whole percent.

Written by `python bench/plan_calibration.py --write-bands`; tests/plan/test_accuracy_bands.py fails when
it no longer matches the figures. Not edited by hand.
"""

BANDS = {found!r}
FIGURES = {counts!r}  # how many published figures each band rests on
# A class no published figure covers (Megatron, GRPO generation, MoE): the widest measured band plus
# five points, and never under 25%; a stated margin, not a measurement.
UNCALIBRATED = {uncalibrated!r}
''')


def all_rows() -> list[Row]:
    """Both sets' rows, the fitting set's first."""
    return evaluate(folder=PUBLISHED) + evaluate(folder=HELDOUT)


def _memory_model_only(path: Path, measure: str) -> float | None:
    """The memory model's estimate for a recipe that planning refuses (a capability the backend
    record does not grant, or a run that does not fit): the recipe is validated without the
    cross-field rules and sized on the layout its preset names, with its own micro batch and
    checkpointing."""
    from recipeforge.config.pipeline import resolve_tree
    from recipeforge.config.schema import recipe_adapter
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.hardware import hardware_for
    from recipeforge.plan.memory import Layout, estimate, measured_view
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.presets import get_preset
    from recipeforge.plan.workload import build_workload

    tree, _ = resolve_tree(path)
    recipe = recipe_adapter().validate_python(tree.data)
    hw = hardware_for(recipe, None)
    planners = Planners.installed()
    w = build_workload(recipe, resolve_model(recipe.model.name_or_path)[0], hw, planners)
    preset = get_preset(recipe.distributed.preset)
    t = recipe.train
    if not isinstance(t.micro_batch_size, int) or not isinstance(t.gradient_checkpointing, bool):
        return None
    layout = Layout(preset.backend, preset.name, data_parallel=hw.num_gpus, zero_stage=preset.zero_stage,
                    offload=preset.offload, fsdp_sharding=preset.sharding or "full_shard",
                    nodes=hw.nodes, gpus_per_node=hw.gpus_per_node)
    layout = planners.bind(layout)  # sized by the preset's backend spec
    accumulation = max(1, t.global_batch_size // (t.micro_batch_size * hw.num_gpus))
    mem = estimate(w, layout, t.micro_batch_size, t.gradient_checkpointing, accumulation=accumulation,
                   gpu_memory=hw.gpu_memory_gb * GIB)
    return measured_view(mem.gb(), measure)


def aggregate(rows: list[Row]) -> dict:
    """Median |error|, share within ±15% and refusals over the figures not excluded."""
    used = [r for r in rows if not r.excluded]
    errors = [abs(r.error) for r in used if r.error is not None]
    return {"cases": len(used), "excluded": len(rows) - len(used),
            "median_abs_error": statistics.median(errors) if errors else None,
            "within_15pct": sum(e <= BAND for e in errors) / len(used) if used else 0.0,
            "refused": [r.name for r in used if r.estimate_gib is None]}


def _set_folder(argv: list[str]) -> Path:
    """The folder `--set NAME` (or `--set=NAME`) names; tests/plan/published/ without it."""
    name = "published"
    for i, arg in enumerate(argv):
        if arg == "--set" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--set="):
            name = arg.split("=", 1)[1]
    if name not in SETS:
        raise SystemExit(f"unknown set {name!r}: one of {', '.join(SETS)}")
    return SETS[name]


def main(argv: list[str]) -> int:
    if "--bands" in argv or "--write-bands" in argv:
        found, counts = bands(all_rows())
        text = bands_module(found, counts)
        if "--write-bands" in argv:
            BANDS_MODULE.write_text(text)
        print(text)
        return 0
    rows = evaluate(folder=_set_folder(argv))
    agg = aggregate(rows)
    if "--markdown" in argv:  # the table in docs/planner.md
        print("| case | source | setting as planned | measure | published GiB | estimate GiB | error |\n"
              "|---|---|---|---|---|---|---|")
        for r in rows:
            est = f"{r.estimate_gib:.1f}" if r.estimate_gib is not None else "refused"
            err = f"{r.error:+.1%}" if r.error is not None else "-"
            note = " (not aggregated)" if r.excluded else ""
            source = r.source.replace("|", "\\|")
            print(f"| {r.name}{note} | {source} | {r.plan or '-'} | {r.measure} | {r.published_gib:.1f} | {est} "
                  f"| {err} |")
        return 0
    if "--json" in argv:
        print(json.dumps({"rows": [{**r.__dict__, "error": r.error} for r in rows], "aggregate": agg}, indent=1))
        return 0
    header = f"{'case':<44} {'measure':<9} {'published':>9} {'estimate':>9} {'error':>7}  plan"
    for title, group in (("Calibration set", [r for r in rows if not r.excluded]),
                         ("Reported, not aggregated", [r for r in rows if r.excluded])):
        print(f"{title} (GiB)\n{header}")
        for r in group:
            est = f"{r.estimate_gib:9.1f}" if r.estimate_gib is not None else "  refused"
            err = f"{r.error:+7.1%}" if r.error is not None else "      -"
            print(f"{r.name:<44} {r.measure:<9} {r.published_gib:9.1f} {est} {err}  {r.plan or r.refusal[:80]}")
            if r.excluded:
                print(f"{'':<46}why: {r.excluded}")
        print()
    print(f"median |error| {agg['median_abs_error']:.1%}; within ±15%: {agg['within_15pct']:.0%} "
          f"of {agg['cases']}; refused: {len(agg['refused'])}; excluded: {agg['excluded']}")
    if not any(a == "--set" or a.startswith("--set=") for a in argv):
        # The score that counts: the figures the model was not fitted to (tests/plan/published_heldout/).
        print()
        for name, folder in SETS.items():
            summary = aggregate(rows if folder == PUBLISHED else evaluate(folder=folder))
            print(f"{'fitting set' if folder == PUBLISHED else 'held-out set':<13} ({name}): median |error| "
                  f"{summary['median_abs_error']:.1%}, within ±15%: {summary['within_15pct']:.0%} of "
                  f"{summary['cases']}, refused: {len(summary['refused'])}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
