"""The translation against the installed Megatron-Bridge itself: every section's dataclass is built
with keyword arguments, so a field the pinned version does not have (or renamed) fails here.

Runs wherever `megatron.bridge` imports (`.ci/megatron` builds such an environment on Python 3.12);
skipped elsewhere.
"""

from __future__ import annotations

import importlib

import pytest

from recipeforge.plan import make_plan


def _bridge_import_error() -> str | None:
    try:
        importlib.import_module("megatron.bridge.training.config")
    except Exception as exc:  # ImportError, or a CUDA/Transformer Engine failure at import
        return f"{type(exc).__name__}: {exc}"
    return None


ERROR = _bridge_import_error()
pytestmark = pytest.mark.skipif(ERROR is not None,
                                reason=f"needs Megatron-Bridge (pip install 'recipeforge[megatron]'): {ERROR}")


def _settings(load, tmp_path, *overrides):
    from recipeforge.backends.megatron_config import megatron_config

    (tmp_path / "d").mkdir()
    for name in ("training", "validation"):  # PackedSequenceSpecs checks that the files resolve
        (tmp_path / "d" / f"{name}.idx.parquet").write_bytes(b"")
    data = {"root": str(tmp_path / "d"), "metadata": str(tmp_path / "d" / "pack_metadata.json"),
            "training": {"parquet": str(tmp_path / "d" / "training.idx.parquet"), "rows": 64},
            "validation": {"parquet": str(tmp_path / "d" / "validation.idx.parquet"), "rows": 8}}
    # pinned: for a LoRA run the planner picks FSDP
    loaded = load("pretrain-llama3-405b", "distributed.backend=megatron", *overrides)
    return megatron_config(make_plan(loaded.recipe), loaded.recipe, run_dir=tmp_path, data=data, train_iters=10,
                           base_checkpoint=tmp_path / "base")


@pytest.mark.parametrize("overrides", [(), ("adapter.type=lora", "train.scheduler=wsd", "logging.tensorboard=true",
                                            "train.optimizer=sgd", "distributed.offload=none")])
def test_every_section_builds_with_keywords(load, tmp_path, overrides):
    from recipeforge.backends.megatron_container import DATASETS, PACKING, SECTIONS, _class, construct

    settings = _settings(load, tmp_path, *overrides)
    for name, spec in SECTIONS.items():
        if settings.get(name) is not None:
            obj = construct(name, _class(spec), settings[name])
            for key, value in settings[name].items():
                if not isinstance(value, str) or key not in ("params_dtype", "pipeline_dtype"):
                    assert getattr(obj, key) == value, (name, key)
    dataset = dict(settings["dataset"])
    specs = construct("offline_packing_specs", _class(PACKING), dataset.pop("offline_packing_specs"))
    built = construct("dataset", _class(DATASETS[dataset.pop("kind")]), {**dataset, "offline_packing_specs": specs})
    built.validate()


def test_an_unknown_field_fails_at_construction():
    from recipeforge.backends.megatron_container import SECTIONS, _class, construct
    from recipeforge.errors import RecipeError

    with pytest.raises(RecipeError, match="does not take optimizer settings"):
        construct("optimizer", _class(SECTIONS["optimizer"]), {"lr": 1e-4, "adam_epsilon": 1e-8})
