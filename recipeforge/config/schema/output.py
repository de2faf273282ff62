"""`output:` — the run directory, checkpoints, resume and export."""

from __future__ import annotations

import re
from typing import Optional, Union

from pydantic import Field, field_validator

from recipeforge.config.schema.base import Section

# Units of `output.max_shard_size`, as transformers' save_pretrained reads them (decimal and binary).
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
DEFAULT_MAX_SHARD_SIZE = "50GB"  # transformers' save_pretrained default


def size_bytes(value: Union[int, str]) -> int:
    """Bytes of a file size written as transformers writes `max_shard_size` ("5GB", "500MB", "2GiB", or
    a number of bytes). Raises ValueError on anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ValueError(f"{value!r} is not a file size: write it as 5GB, 500MB, 2GiB or a number of bytes")
        n = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "B").upper()])
    if n <= 0:
        raise ValueError(f"{value!r}: a file size must be above 0")
    return n


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
    max_shard_size: Union[int, str] = Field(
        DEFAULT_MAX_SHARD_SIZE,
        description="Largest safetensors file of final/'s full weights (as transformers' save_pretrained "
                    "`max_shard_size`: 5GB, 500MB, 2GiB or bytes). A larger model is written as "
                    "model-0000i-of-0000N.safetensors files with model.safetensors.index.json. The host memory "
                    "a single process's save needs grows with it (one file is serialised at a time); a sharded "
                    "model (FSDP2) is written tensor by tensor whatever the size.")
    merge_adapter: bool = Field(False, description="Also write merged/: the base model with the adapter merged in.")
    push_to_hub: Optional[HubPushConfig] = Field(None, description="Upload the final model to the Hub.")

    @field_validator("max_shard_size")
    @classmethod
    def _size(cls, value: Union[int, str]) -> Union[int, str]:
        size_bytes(value)
        return value
