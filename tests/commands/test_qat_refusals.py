"""Quantization-aware training swaps a whole model's linear layers for torchao's fake-quantized ones: a run
whose plan shards the weights (FSDP2, ZeRO-3) is refused by `train` before any worker starts, at `train.qat`
with the backends that can run it, and one that keeps whole weights on every process (DDP) is accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SFT = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
QAT = ("train.qat.scheme=int4_weight", "train.micro_batch_size=auto", "--nproc-per-node", "2")


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", "train", str(SFT), *overrides, *QAT,
                           f"output.dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)


def test_a_plan_that_shards_the_weights_is_refused_at_train_qat(tmp_path):
    for pinned in (("distributed.backend=fsdp",), ("distributed.backend=deepspeed", "distributed.zero_stage=3")):
        done = _train(tmp_path, *pinned)
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert "train.qat" in done.stderr and "shards the weights across processes" in done.stderr, done.stderr
        assert "pin distributed.backend: ddp" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run directory was made, no worker started


def test_whole_weights_on_every_process_are_accepted(tmp_path):
    done = _train(tmp_path, "distributed.backend=ddp", "--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "accelerate launch" in done.stdout + done.stderr
