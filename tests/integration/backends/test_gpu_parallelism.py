"""Context and tensor parallel on CUDA GPUs (skipped without two): the tiny SFT recipe with
`context_parallel: 2` (accelerate ParallelismConfig.cp_size on FSDP2, PyTorch ring attention) and with
`tensor_parallel: 2` (transformers' tensor-parallel plan loaded sharded), each following the
one-GPU loss curve. Context parallel needs CUDA (its ring attention is CUDA-only in PyTorch); the
CPU side of tensor parallel is tested in test_tensor_parallel_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.backends.test_gpu_backends import SFT, _gpus, _loss_matches, _train

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

needs_two = pytest.mark.skipif("_gpus() < 2", reason="needs two CUDA GPUs")
UNPACKED = ("data.packing=false", "model.attn_implementation=sdpa", "data.sequence_len=128")


@pytest.fixture(scope="module")
def unpacked_reference(tiny, tmp_path_factory) -> Path:
    return _train(tiny, SFT, tmp_path_factory.mktemp("cp") / "single", "distributed.backend=single", *UNPACKED,
                  "--nproc-per-node", "1")


@needs_two
def test_context_parallel_splits_sequences(tiny, tmp_path, unpacked_reference):
    run = _train(tiny, SFT, tmp_path / "cp", "distributed.backend=fsdp", "distributed.context_parallel=2",
                 *UNPACKED, "--nproc-per-node", "2")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["extra"]["context_parallel"] == 2 and plan["data_parallel"] == 1
    report = json.loads((run / "backend.json").read_text())["observed"]
    assert report["distributed_type"] == "FSDP" and report["parallelism"]["cp"] == 2
    assert report["dtensor_params"] == report["params"] > 0
    _loss_matches(tiny, run, unpacked_reference)


@needs_two
def test_tensor_parallel_through_the_trainer(tiny, tmp_path, unpacked_reference):
    run = _train(tiny, SFT, tmp_path / "tp", "distributed.backend=fsdp", "distributed.tensor_parallel=2",
                 *UNPACKED, "--nproc-per-node", "2")
    report = json.loads((run / "backend.json").read_text())["observed"]
    assert report["tp_size"] == 2 and report["parallelism"]["tp"] == 2
    assert report["dtensor_params"] > 0 and report["local_param_elements"] < report["full_param_elements"]
    _loss_matches(tiny, run, unpacked_reference)
