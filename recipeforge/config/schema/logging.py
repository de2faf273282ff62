"""`logging:` — where metrics go besides metrics.jsonl (always written)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from recipeforge.config.schema.base import Section


class WandbConfig(Section):
    """Weights & Biases (needs the `wandb` extra)."""

    project: str = Field(min_length=1, description="W&B project.")
    entity: Optional[str] = Field(None, description="W&B team or user.")
    name: Optional[str] = Field(None, description="Run name (default: the recipe's name).")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="`offline` writes into the run dir only (RUN/wandb; `wandb sync` uploads it later).")
    tags: tuple[str, ...] = Field((), description="Run tags.")


class MlflowConfig(Section):
    """MLflow tracking (needs the `mlflow` extra)."""

    tracking_uri: Optional[str] = Field(
        None, description="Tracking server (http://...), a file store (file:PATH; MLflow 3 deprecates it, recipeforge "
                          "opts in) or sqlite:///PATH (needs the full mlflow package). Default: MLFLOW_TRACKING_URI, "
                          "else a file store in the run dir (RUN/mlruns).")
    experiment: str = Field("recipeforge", min_length=1, description="Experiment name.")


class LoggingConfig(Section):
    """Experiment trackers and the console. Nothing is sent anywhere unless configured here; trackers run on
    the main process only and log the resolved recipe as their config."""

    tensorboard: bool = Field(False, description="Write tensorboard event files into the run dir.")
    wandb: Optional[WandbConfig] = Field(None, description="Log to Weights & Biases.")
    mlflow: Optional[MlflowConfig] = Field(None, description="Log to MLflow.")
    progress_bar: bool = Field(
        True, description="One progress line on the console (rank 0): step/total, loss, tokens/s, ETA; rewritten in "
                          "place on a terminal, else printed every 30 s (RECIPEFORGE_PROGRESS_INTERVAL).")
