"""Experiment trackers (W&B, MLflow) as trainer callbacks that recipeforge owns.

The trainer's own integrations (``report_to``) are never used: they start whatever tracker happens to
be installed, log the trainer's arguments instead of the recipe, leave the W&B run open until the
interpreter exits (after the process group is gone), and configure themselves through process-wide
environment variables. Here only the trackers the recipe names run, on the main process only:

- the resolved recipe (as written to the run directory, secrets redacted) is the run's config: nested
  for W&B, flattened to dotted keys (``train.learning_rate``) as MLflow params;
- every logged record goes out with the trainer's step, under the names metrics.jsonl uses;
- MLflow also gets plan.json and resolved_recipe.yaml as artifacts when the run starts; without a
  tracking URI its runs go to a file store in the run directory (RUN/mlruns);
- each tracker's run is finished when training ends (or fails), inside the training call: before
  the final save, the merge and the end of the process group;
- a resumed run continues the tracker run it started (RUN/trackers.json keeps each tracker's run id
  and the recipe it was started with): W&B resumes the same id, MLflow reopens the same run, the step
  axis goes on from the checkpoint's step, and a recipe changed since (`--force`) is said in the
  tracker (W&B summary, MLflow tags) key by key.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable

from recipeforge.errors import RecipeError

MAX_PARAM_LENGTH = 6000  # MLflow refuses longer parameter values
RECORD = "trackers.json"  # the tracker runs a run directory started, for resuming them


def flatten(data: object, prefix: str = "") -> dict[str, Any]:
    """Dotted keys for a nested recipe: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``; list items are
    numbered (``data.datasets.0.path``); empty sections and lists keep their key."""
    out: dict[str, Any] = {}
    if isinstance(data, dict) and data:
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, (list, tuple)) and data:
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    elif prefix:
        out[prefix] = data
    return out


def numeric_metrics(logs: dict) -> dict[str, float]:
    """The numbers of a trainer log record (trackers take no strings or lists)."""
    out = {}
    for k, v in logs.items():
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k] = v
    return out


def read_resolved(run) -> dict:
    """The resolved recipe the main process wrote into the run directory (secrets already redacted)."""
    import yaml

    try:
        return yaml.safe_load(run.resolved_recipe.read_text()) or {}
    except OSError:
        return {}


def check_installed(recipe, locate: Callable[[tuple], Any] | None = None) -> None:
    """A recipe naming a tracker whose package is missing is refused before anything trains."""
    lg = recipe.logging
    for name, section, active in (("wandb", lg.wandb, lg.wandb is not None and lg.wandb.mode != "disabled"),
                                  ("mlflow", lg.mlflow, lg.mlflow is not None)):
        if active and importlib.util.find_spec(name) is None:
            raise RecipeError(f"logging.{name} needs the {name} package, which is not installed",
                              key=f"logging.{name}", location=locate(("logging", name)) if locate else None,
                              hint=f"pip install 'recipeforge[{name}]', or remove logging.{name}")


def tracker_callbacks(recipe, run, *, run_name: str | None, is_main: bool, wandb_name: str | None = None,
                      locate: Callable[[tuple], Any] | None = None) -> list:
    """The tracker callbacks the recipe asks for (an empty list on processes other than the main one:
    only the main process talks to trackers, so no other rank starts a tracker service)."""
    check_installed(recipe, locate)
    if not is_main:
        return []
    lg = recipe.logging
    out: list = []
    if lg.wandb is not None and lg.wandb.mode != "disabled":
        out.append(_wandb_callback(lg.wandb, run, wandb_name or run_name or run.root.name))
    if lg.mlflow is not None:
        out.append(_mlflow_callback(lg.mlflow, run, run_name or run.root.name))
    return out


def read_record(run) -> dict:
    """RUN/trackers.json: {tracker: {"id": ..., "recipe": {flat recipe it started with}, ...}}."""
    import json

    try:
        return json.loads((run.root / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def remember(run, tracker: str, entry: dict) -> None:
    """Record `tracker`'s run in RUN/trackers.json (atomically: a crash leaves the old record)."""
    import json

    record = read_record(run)
    record[tracker] = entry
    path = run.root / RECORD
    tmp = path.with_name(f"{RECORD}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def changes(before: dict, after: dict) -> dict[str, str]:
    """``key: "old -> new"`` for every flat recipe key whose value differs (added and removed keys too)."""
    out = {}
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
        if _param_value(old) != _param_value(new):
            out[key] = f"{_param_value(old)} -> {_param_value(new)}"
    return out


def resumed_entry(run, tracker: str, state) -> dict | None:
    """The recorded run of `tracker` when this training call resumes a checkpoint (else None)."""
    if not getattr(state, "global_step", 0):
        return None
    entry = read_record(run).get(tracker)
    return entry if isinstance(entry, dict) and entry.get("id") else None


class TrackerFailure:
    """A tracker that failed mid-run stops logging, with one warning: metrics.jsonl keeps every record,
    and a tracker server going away must not cost the run its remaining steps and checkpoints."""

    def __init__(self, name: str):
        self.name = name
        self.stopped = False

    def run(self, what: str, fn: Callable[[], Any]) -> bool:
        """Call `fn` unless this tracker stopped; an exception stops it (and is reported once).
        Returns whether `fn` ran and succeeded."""
        if self.stopped:
            return False
        try:
            fn()
            return True
        except Exception as exc:  # the service's error, whatever the client library raises
            self.stopped = True
            import sys

            from recipeforge.credentials import redact_credentials

            reason = redact_credentials(" ".join(str(exc).split()))[:300] or type(exc).__name__
            print(f"[recipeforge] warning: {self.name} stopped logging ({what} failed: {reason}); training goes "
                  f"on and metrics.jsonl keeps every record", file=sys.stderr, flush=True)
            return False


class _ScopedEnv:
    """Environment variables set for the lifetime of one tracker run, then put back."""

    def __init__(self):
        self._saved: dict[str, str | None] = {}

    def set(self, env: dict[str, str]) -> None:
        for k, v in env.items():
            self._saved.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def restore(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved.clear()


def _wandb_callback(cfg, run, run_name: str):
    from transformers import TrainerCallback

    class WandbTracker(TrainerCallback):
        """One W&B run per training call, its files (offline runs, logs, caches) under RUN/wandb."""

        def __init__(self):
            self.wb_run = None
            self.env = _ScopedEnv()
            self.failure = TrackerFailure("W&B")

        def on_train_begin(self, args, state, control, **kwargs):
            if self.wb_run is None and not self.failure.run("starting the run", lambda: self._start(state)):
                self.env.restore()

        def _start(self, state) -> None:
            import wandb

            root = run.root / "wandb"
            root.mkdir(parents=True, exist_ok=True)
            # Where the wandb service keeps its caches, settings and logs: read from the environment
            # when the service starts, so they are set for this run only.
            self.env.set({"WANDB_DIR": str(root), "WANDB_CACHE_DIR": str(root / "cache"),
                          "WANDB_CONFIG_DIR": str(root / "config"), "WANDB_DATA_DIR": str(root / "data"),
                          "WANDB_ARTIFACT_DIR": str(root / "artifacts")})
            recipe = read_resolved(run)
            earlier = resumed_entry(run, "wandb", state)
            if earlier is None:
                self.wb_run = wandb.init(project=cfg.project, entity=cfg.entity, name=run_name,
                                         tags=list(cfg.tags) or None, mode=cfg.mode, dir=str(root), config=recipe)
            else:  # the same W&B run goes on, its step axis from the checkpoint's step
                self.wb_run = wandb.init(project=cfg.project, entity=cfg.entity, name=run_name,
                                         tags=list(cfg.tags) or None, mode=cfg.mode, dir=str(root),
                                         id=earlier["id"], resume="allow")
                changed = changes(earlier.get("recipe", {}), flatten(recipe))
                self.wb_run.config.update(recipe, allow_val_change=True)
                self.wb_run.summary["recipeforge/resumed_at_step"] = state.global_step
                if changed:
                    self.wb_run.summary["recipeforge/changed_on_resume"] = changed
            remember(run, "wandb", {"id": self.wb_run.id, "project": cfg.project, "recipe": flatten(recipe)})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.wb_run is not None and logs:
                self.failure.run("logging", lambda: self.wb_run.log(numeric_metrics(logs), step=state.global_step))

        def on_train_end(self, args, state, control, **kwargs):
            self.close(failed=False)

        def close(self, *, failed: bool) -> None:
            """Finish the W&B run now (exit code 1 when training failed); later calls do nothing."""
            if self.wb_run is None:
                return
            wb_run, self.wb_run = self.wb_run, None
            try:
                self.failure.stopped = False  # finishing is worth a try even after a failed log call
                self.failure.run("finishing the run", lambda: wb_run.finish(exit_code=1 if failed else 0))
            finally:
                self.env.restore()

    return WandbTracker()


class _MlflowTracking:
    """One MLflow run per training call, through an explicit client (no global active run).

    The trainer-callback half comes from `_mlflow_callback`, which imports transformers: this module
    stays importable without it.
    """

    def __init__(self, cfg, run, run_name: str):
        self.cfg, self.run, self.run_name = cfg, run, run_name
        self.client = None
        self.run_id: str | None = None
        self.env = _ScopedEnv()
        self.failure = TrackerFailure("MLflow")

    def on_train_begin(self, args, state, control, **kwargs):
        if self.run_id is None and not self.failure.run("starting the run", lambda: self._start(state)):
            self.env.restore()

    def _start(self, state) -> None:
        from mlflow import MlflowClient

        uri = self._tracking_uri()
        self._set_environment(uri)
        self.client = MlflowClient(tracking_uri=uri)
        recipe = flatten(read_resolved(self.run))
        earlier = resumed_entry(self.run, "mlflow", state)
        if earlier is not None and earlier.get("tracking_uri") == uri:
            self._reopen(earlier, recipe, state.global_step)
            remember(self.run, "mlflow", {**earlier, "recipe": {**earlier.get("recipe", {}), **recipe}})
            return
        self._create(uri, recipe)

    def _tracking_uri(self) -> str:
        """The recipe's tracking URI, else MLFLOW_TRACKING_URI, else a file store in the run directory."""
        # Without a tracking URI (recipe or MLFLOW_TRACKING_URI): a file store in the run directory,
        # like W&B's offline files (MLflow's own default, sqlite, needs the full mlflow package).
        return self.cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{self.run.root / 'mlruns'}"

    def _set_environment(self, uri: str) -> None:
        """MLflow's settings for this run, read by the client from the environment (put back at close)."""
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses its file store unless asked for it; the recipe asked for it.
            self.env.set({"MLFLOW_ALLOW_FILE_STORE": "true"})
        # MLflow retries a failing request 7 times with exponential backoff (minutes per call); a
        # server that went away then costs a few seconds, not the run's time (the user's own settings win).
        self.env.set({name: value for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"),
                                                      ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30"))
                      if name not in os.environ})

    def _create(self, uri: str, recipe: dict) -> None:
        """A new MLflow run in the recipe's experiment: recorded for resuming, then the recipe as its
        parameters and plan.json and resolved_recipe.yaml as its artifacts."""
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(self.cfg.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(self.cfg.experiment))
        created = self.client.create_run(experiment_id, run_name=self.run_name,
                                         tags={"recipeforge.run_dir": str(self.run.root)})
        self.run_id = created.info.run_id
        remember(self.run, "mlflow", {"id": self.run_id, "tracking_uri": uri, "recipe": recipe})
        self._log_params([Param(k, _param_value(v)) for k, v in recipe.items()])
        for path in (self.run.plan, self.run.resolved_recipe):
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))

    def _reopen(self, earlier: dict, recipe: dict, step: int) -> None:
        """The recorded MLflow run, running again: parameters it lacks are added (a logged
        parameter cannot change), and what changed since it started is set as tags."""
        from mlflow.entities import Param, RunTag

        self.run_id = earlier["id"]
        self.client.update_run(self.run_id, status="RUNNING")
        before = earlier.get("recipe", {})
        added = [Param(k, _param_value(v)) for k, v in recipe.items() if k not in before]
        changed = changes({k: v for k, v in before.items()}, recipe)
        tags = [RunTag("recipeforge.resumed_at_step", str(step))]
        tags += [RunTag(f"recipeforge.changed.{k}"[:250], v[:5000]) for k, v in changed.items() if k in before]
        self._log_params(added)
        self.client.log_batch(self.run_id, tags=tags)

    def _log_params(self, params: list) -> None:
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run_id is None or not logs:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_metric_name(k), float(v), now, state.global_step)
                   for k, v in numeric_metrics(logs).items()]
        if metrics:
            self.failure.run("logging", lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def on_train_end(self, args, state, control, **kwargs):
        self.close(failed=False)

    def close(self, *, failed: bool) -> None:
        """Mark the MLflow run finished (or failed); later calls do nothing."""
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        try:
            self.failure.stopped = False  # marking the run ended is worth a try after a failed log call
            self.failure.run("ending the run",
                             lambda: self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED"))
        finally:
            self.env.restore()


def _mlflow_callback(cfg, run, run_name: str):
    from transformers import TrainerCallback

    # The tracking lives in `_MlflowTracking`, first in the order so its hooks replace the callback's no-ops.
    class MlflowTracker(_MlflowTracking, TrainerCallback):
        """One MLflow run per training call, through an explicit client (no global active run)."""

    return MlflowTracker(cfg, run, run_name)


def _param_value(v: object) -> str:
    text = "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    return text if len(text) <= MAX_PARAM_LENGTH else text[:MAX_PARAM_LENGTH - 3] + "..."


def _metric_name(name: str) -> str:
    """MLflow accepts letters, digits and ``_-. :/`` in metric names (``rewards/accuracies`` stays)."""
    import re

    return re.sub(r"[^0-9A-Za-z_\-. :/]", "_", name)


def close_all(callbacks: list, *, failed: bool) -> None:
    """Finish every tracker run among `callbacks` (training failed or ended); a tracker that cannot
    finish does not hide the training outcome."""
    for cb in callbacks:
        close = getattr(cb, "close", None)
        if close is None:
            continue
        try:
            close(failed=failed)
        except Exception as exc:  # a tracker's own failure must not replace the training error
            import sys

            print(f"[recipeforge] warning: closing {type(cb).__name__} failed: {exc}", file=sys.stderr, flush=True)

