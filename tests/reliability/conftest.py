"""Finished tiny runs for the tests of the commands that read one (serve, chat, eval, export, merge):
trained once per session, in this process, two optimizer steps each."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def full_run(tiny, tmp_path_factory) -> Path:
    """A full fine-tune: final/ holds the weights, checkpoints/ two complete checkpoints."""
    return tiny.train("sft-full", tmp_path_factory.mktemp("full") / "full-run", "train.max_steps=2",
                      "output.save_steps=1", "data.val_size=0")


@pytest.fixture(scope="session")
def lora_run(tiny, tmp_path_factory) -> Path:
    """A LoRA run: final/ holds the adapter, base_model/ the random-init base it belongs to."""
    return tiny.train("sft-lora", tmp_path_factory.mktemp("lora") / "lora-run", "train.max_steps=2",
                      "output.merge_adapter=false")
