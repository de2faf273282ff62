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
    mode: Literal["online", "offline", "disabled"] = Field("online", description="`offline` writes into the run dir only.")
    tags: tuple[str, ...] = Field((), description="Run tags.")


class MlflowConfig(Section):
    """MLflow tracking (needs the `mlflow` extra)."""

    tracking_uri: Optional[str] = Field(None, description="Tracking server or file store (default: ./mlruns).")
    experiment: str = Field("recipeforge", min_length=1, description="Experiment name.")


class LoggingConfig(Section):
    """Experiment trackers. Nothing is sent anywhere unless configured here."""

    tensorboard: bool = Field(False, description="Write tensorboard event files into the run dir.")
    wandb: Optional[WandbConfig] = Field(None, description="Log to Weights & Biases.")
    mlflow: Optional[MlflowConfig] = Field(None, description="Log to MLflow.")
    progress_bar: bool = Field(True, description="Console progress bar (rank 0 only).")
