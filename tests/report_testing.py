"""Run directories for the report tests, written by the run directory's own writers (tests/ is on
pytest's pythonpath)."""

from __future__ import annotations

import json

from recipeforge.outputs.metrics import MetricsWriter
from recipeforge.outputs.run_dir import RunDir

RECIPE = {"stage": "sft", "model": {"name_or_path": "tiny:llama"},
          "train": {"learning_rate": 0.01, "max_steps": 4, "seed": 42},
          "output": {"dir": "x"}, "logging": {"progress_bar": False}}


def make_run(root, *, lr=0.01, losses=(3.0, 2.5, 2.0), finished=False, summary=False, recipe=True):
    run = RunDir(root)
    root.mkdir(parents=True)
    if recipe:
        data = json.loads(json.dumps(RECIPE))
        data["train"]["learning_rate"] = lr
        data["output"]["dir"] = str(root)
        run.write_recipe(data)
    writer = MetricsWriter(run.metrics)
    writer.write({"split": "data", "step": 0, "train_rows": 10, "time": 100.0})
    for i, loss in enumerate(losses, start=1):
        writer.write({"split": "train", "step": 2 * i, "loss": loss, "learning_rate": lr, "time": 100.0 + 10 * i,
                      "num_tokens": 1000 * i})
    writer.write({"split": "eval", "step": 2 * len(losses), "eval_loss": losses[-1] + 0.1, "time": 200.0})
    if summary:
        writer.write({"split": "summary", "step": 2 * len(losses), "train_runtime": 61.5, "time": 201.0})
    if finished:
        run.final.mkdir()
    return root
