"""Calibration of the planner's memory model against published, measured peak-memory figures.

Every recipe under tests/plan/published/ reproduces one published fine-tuning run; its header names
the source and carries a ``# calibration: {published: X, unit: GiB, measure: M}`` line. Figures count
different things, so each is compared with the matching part of the estimate
(`recipeforge.plan.memory.measured_view`):

- ``allocated``: torch's max_memory_allocated / active (no allocator cache, no CUDA context);
- ``reserved``: torch's max_memory_reserved (the allocator's segments, no CUDA context);
- ``device``: what nvidia-smi shows (reserved + CUDA context and NCCL buffers).

    python bench/plan_calibration.py [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "tests" / "plan" / "published"
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


def evaluate(paths=None) -> list[Row]:
    """Plan every published recipe on its own hardware and compare with the published figure."""
    from recipeforge.config import load_recipe
    from recipeforge.errors import RecipeError
    from recipeforge.plan import hardware_for, make_plan
    from recipeforge.plan.memory import measured_view

    rows = []
    for path in sorted(paths or PUBLISHED.glob("*.yaml")):
        meta, source, setting = _header(path)
        published = float(meta["published"]) * (GB / GIB if meta["unit"] == "GB" else 1.0)
        recipe = load_recipe(str(path)).recipe
        try:
            plan = make_plan(recipe, hardware_for(recipe, None))
        except RecipeError as exc:
            rows.append(Row(path.stem, source, setting, published, meta["measure"], None, "", str(exc)))
            continue
        estimate = measured_view(plan.memory_gb, meta["measure"])
        label = plan.backend + (f" {plan.preset}" if plan.preset else "")
        rows.append(Row(path.stem, source, setting, published, meta["measure"], estimate,
                        f"{label}, micro {plan.micro_batch_size}, ckpt {'on' if plan.gradient_checkpointing else 'off'}"))
    return rows


def aggregate(rows: list[Row]) -> dict:
    """Median |error|, share within ±15%, refusals."""
    errors = [abs(r.error) for r in rows if r.error is not None]
    return {"cases": len(rows), "median_abs_error": statistics.median(errors) if errors else None,
            "within_15pct": sum(e <= BAND for e in errors) / len(rows) if rows else 0.0,
            "refused": [r.name for r in rows if r.estimate_gib is None]}


def main(argv: list[str]) -> int:
    rows = evaluate()
    agg = aggregate(rows)
    if "--json" in argv:
        print(json.dumps({"rows": [{**r.__dict__, "error": r.error} for r in rows], "aggregate": agg}, indent=1))
        return 0
    print(f"{'case':<44} {'measure':<9} {'published':>9} {'estimate':>9} {'error':>7}  plan")
    for r in rows:
        est = f"{r.estimate_gib:9.1f}" if r.estimate_gib is not None else "  refused"
        err = f"{r.error:+7.1%}" if r.error is not None else "      -"
        print(f"{r.name:<44} {r.measure:<9} {r.published_gib:9.1f} {est} {err}  {r.plan or r.refusal[:80]}")
    print(f"\nmedian |error| {agg['median_abs_error']:.1%}; within ±15%: {agg['within_15pct']:.0%} "
          f"of {agg['cases']}; refused: {len(agg['refused'])}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
