"""DDP does not search for unused parameters in a causal LM: a two-process LoRA run over gloo trains
without paying (and warning about) the extra autograd traversal per step."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from recipeforge.backends.launcher_command import launcher_command

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
# torchrun of this Python, as recipeforge starts it: the script beside it, or `python -m torch.distributed.run`
# in a virtual environment on top of another one, whose bin/ has no launcher scripts.
TORCHRUN = launcher_command("torchrun", "torch.distributed.run")
WARNING = "find_unused_parameters=True was specified in DDP constructor"


def test_lora_ddp_runs_without_the_unused_parameter_search(tmp_path):
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "recipeforge", "train", str(LORA),
           f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=3",
           "train.micro_batch_size=auto", "train.logging_steps=1", "data.val_size=0", "logging.progress_bar=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    observed = json.loads((tmp_path / "run" / "backend.json").read_text())["observed"]
    assert (observed["num_processes"], observed["ddp"]) == (2, True)
    assert WARNING not in proc.stderr
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()
