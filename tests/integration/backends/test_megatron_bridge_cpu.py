"""Megatron-Bridge itself on the CPU: `recipeforge convert-checkpoint` of the tiny Llama and the tiny Qwen2 to
Megatron and back, at tensor parallel 1 and 2 (two gloo processes), gives the same weights bit for bit.

Runs where `megatron.bridge` imports (the Python 3.12 environment `.ci/megatron` builds); skipped elsewhere,
except that with RECIPEFORGE_REQUIRE_MEGATRON=1 (set by `.ci/megatron`) a failed import fails the run.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "pretrain.yaml"
REQUIRED = os.environ.get("RECIPEFORGE_REQUIRE_MEGATRON") == "1"


def _bridge_import_error() -> str | None:
    try:
        importlib.import_module("megatron.bridge")
    except Exception as exc:  # ImportError, or a library failing while it loads
        return f"{type(exc).__name__}: {exc}"
    return None


ERROR = _bridge_import_error()
needs_bridge = pytest.mark.skipif(ERROR is not None, reason=f"needs Megatron-Bridge (.ci/megatron): {ERROR}")


def test_megatron_bridge_imports():
    """The Megatron step must run Megatron-Bridge, not skip past it."""
    if ERROR is not None and not REQUIRED:
        pytest.skip(f"Megatron-Bridge is not installed here: {ERROR}")
    assert ERROR is None, f"import megatron.bridge failed: {ERROR}"
    import megatron.bridge
    import megatron.core

    assert megatron.bridge.__version__.startswith("0.6.") and megatron.core.__version__.startswith("0.19.")


def _convert(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "convert-checkpoint", str(RECIPE), *args],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no safetensors in {folder}"
    return out


@needs_bridge
@pytest.mark.parametrize("arch,tp_in,tp_out", [("llama", 1, 2), ("qwen2", 2, 1)])
def test_round_trip_through_megatron_is_bit_equal(tmp_path, arch, tp_in, tp_out):
    """HF -> Megatron at `tp_in` processes -> HF at `tp_out`: Megatron-Core's distributed checkpoint is
    resharded between the two, and every weight comes back bit-equal (fp32, nothing is computed)."""
    import yaml

    out = tmp_path / "conv"
    _convert(f"model.name_or_path=tiny:{arch}", "-o", str(out), "--tensor-parallel", str(tp_in))
    ckpt = out / "megatron" / "ckpt"
    saved = ckpt / "iter_0000000"
    run_config = yaml.safe_load((saved / "run_config.yaml").read_text())
    assert run_config["model"]["tensor_model_parallel_size"] == tp_in
    assert len(list(saved.glob("*.distcp"))) == tp_in  # every rank wrote its slices
    done = json.loads((out / "megatron" / "done.json").read_text())
    assert done["tensor_parallel"] == tp_in and done["layer_spec"] == "local"

    hf = tmp_path / "hf"
    _convert(f"model.name_or_path=tiny:{arch}", "--to-hf", str(ckpt), "-o", str(hf), "--tensor-parallel", str(tp_out))
    before, after = _weights(out / "base_model"), _weights(hf)
    assert set(after) == set(before)
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and after[name].shape == tensor.shape, name
        assert after[name].equal(tensor), f"{name} changed in the round trip"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf)  # what transformers loads is the original model
    assert model.config.model_type == arch
