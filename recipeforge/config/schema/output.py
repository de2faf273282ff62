"""`output:` — the run directory, checkpoints, resume and export."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from recipeforge.config.schema.base import Section


class HubPushConfig(Section):
    """Upload the model to the Hugging Face Hub once the run is complete and saved: final/ (merged/ with
    merge_adapter) and the model card; never checkpoints, logs or optimizer states. Needs a token (HF_TOKEN or
    `hf auth login`). A failed upload leaves the run complete, `train` exits with 3, and
    `recipeforge push RUN_DIR` retries."""

    repo_id: str = Field(min_length=1, description="Target repository, e.g. my-org/my-model.")
    private: bool = Field(True, description="Create the repository as private.")


class OutputConfig(Section):
    """Where the run is written and how it is checkpointed."""

    dir: Optional[str] = Field(None, description="Run directory (default: runs/<recipe file name>).")
    save_steps: Optional[int] = Field(None, gt=0, description="Checkpoint every N steps (null: at the end of each epoch).")
    save_total_limit: Optional[int] = Field(3, gt=0, description="Keep at most this many checkpoints (null: all).")
    resume: str = Field(
        "auto", min_length=1,
        description="`auto`: continue from the newest complete checkpoint in the run dir; `never`; or a checkpoint path.")
    merge_adapter: bool = Field(False, description="Also write merged/: the base model with the adapter merged in.")
    push_to_hub: Optional[HubPushConfig] = Field(None, description="Upload the final model to the Hub.")
