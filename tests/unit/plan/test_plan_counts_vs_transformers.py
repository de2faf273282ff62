"""The analytic counts equal the parameters transformers actually builds, architecture by architecture.

Models are instantiated on the meta device (no memory) with two layers, which exercises every
per-layer and per-model term of the formulas.
"""

from __future__ import annotations

import pytest

from recipeforge.components.tiny_spec import TINY_CONFIGS
from recipeforge.plan.catalog import KNOWN_CONFIGS
from recipeforge.plan.models import spec_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _one_per_type() -> dict[str, dict]:
    seen: dict[str, dict] = {}
    for name, cfg in KNOWN_CONFIGS.items():
        seen.setdefault(cfg["model_type"], {"name": name, **cfg})
    for arch, cfg in TINY_CONFIGS.items():
        seen[f"tiny:{arch}"] = {"name": f"tiny:{arch}", **cfg}
    return seen


def _hf_count(cfg: dict) -> int:
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "name")}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)
    # vision-language models are built with their vision tower, which the planner counts too
    auto = transformers.AutoModelForImageTextToText if "vision_config" in cfg else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum({id(p): p.numel() for p in model.parameters()}.values())


@pytest.mark.parametrize("cfg", list(_one_per_type().values()), ids=lambda c: c["name"])
def test_count_equals_transformers(cfg):
    small = dict(cfg)
    if cfg["model_type"] == "gpt2":
        small["n_layer"] = 2
    else:
        small["num_hidden_layers"] = 2
    spec = spec_from_config({k: v for k, v in small.items() if k != "name"})
    assert spec.total_params() == _hf_count(small)
