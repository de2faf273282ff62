"""Conversion outside the job: cache keys, clear errors without Megatron, the tiny model's weights on
disk, the newest Megatron checkpoint, and the stage runner chosen by backend."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from recipeforge.backends.megatron_convert import cache_key, hf_source, import_checkpoint, latest_checkpoint
from recipeforge.errors import RecipeError

NO_BRIDGE = importlib.util.find_spec("megatron") is None


def test_cache_key_follows_model_revision_and_remote_code():
    a = cache_key("meta-llama/Llama-3.1-8B", None, False)
    assert a == cache_key("meta-llama/Llama-3.1-8B", None, False) and a.startswith("Llama-3.1-8B-")
    assert len({a, cache_key("meta-llama/Llama-3.1-8B", "abc123", False),
                cache_key("meta-llama/Llama-3.1-8B", None, True), cache_key("other/Llama-3.1-8B", None, False)}) == 4


@pytest.mark.skipif(not NO_BRIDGE, reason="Megatron-Bridge is installed here")
def test_without_megatron_the_error_names_the_extra(load, tmp_path):
    recipe = load("pretrain-llama3-405b").recipe
    with pytest.raises(RecipeError, match="needs Megatron-Bridge") as info:
        import_checkpoint(recipe, cache_root=tmp_path / "cache", log=lambda m: None)
    assert "recipeforge[megatron]" in info.value.problems[0].hint
    assert not list((tmp_path / "cache").glob("*/done.json"))  # nothing half-written is taken as converted


def test_a_tiny_model_is_written_before_conversion(load, tmp_path):
    recipe = load("tiny/sft-full").recipe
    source = hf_source(recipe, tmp_path)
    assert source == str(tmp_path / "base_model") and (tmp_path / "base_model" / "config.json").is_file()
    assert hf_source(load("pretrain-llama3-405b").recipe, tmp_path) == load("pretrain-llama3-405b").recipe.model.name_or_path


def test_latest_checkpoint_reads_megatrons_tracker(tmp_path):
    with pytest.raises(RecipeError, match="no checkpoint"):
        latest_checkpoint(tmp_path)
    for n in (10, 20):
        (tmp_path / f"iter_{n:07d}").mkdir()
    assert latest_checkpoint(tmp_path).name == "iter_0000020"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10\n")
    assert latest_checkpoint(tmp_path).name == "iter_0000010"


def test_the_megatron_backend_gets_its_own_runner_on_the_stage_protocol():
    from recipeforge.stages import runner_class
    from recipeforge.stages.megatron_lm import MegatronLMStage

    from recipeforge.backends import get_backend

    megatron = get_backend("megatron")
    assert runner_class("sft", megatron.runner("sft")) is MegatronLMStage
    assert runner_class("pretrain", megatron.runner("pretrain")) is MegatronLMStage
    assert runner_class("sft").__name__ == "SFTStage" and megatron.runner("dpo") is None
    assert get_backend("fsdp").runner("sft") is None  # a trainer backend runs the stage's own runner
    for method in ("setup", "train", "save"):
        assert callable(getattr(MegatronLMStage, method))
    assert not any(m.startswith("recipeforge.backends") for m in _imports_of("recipeforge.stages.megatron_lm"))


def _imports_of(module: str) -> list[str]:
    import ast
    import importlib

    tree = ast.parse(open(importlib.import_module(module).__file__).read())
    return [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def test_the_stage_writes_data_and_asks_the_backend_for_its_config(load, tmp_path):
    """setup() on one CPU process up to the configuration (Megatron itself is not needed for that)."""
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan import make_plan
    from recipeforge.stages.base import StageContext
    from recipeforge.stages.megatron_lm import MegatronLMStage

    loaded = load("tiny/sft-full", f"data.cache_dir={tmp_path / 'cache'}")
    seen = {}

    def build_config(*, data, train_iters):
        seen.update(data=data, train_iters=train_iters)
        return "config"

    run = RunDir(tmp_path / "run")
    run.root.mkdir(parents=True)
    ctx = StageContext(loaded=loaded, plan=make_plan(loaded.recipe), run=run,
                       backend_kwargs={"build_config": build_config}, log=lambda m: None)
    stage = MegatronLMStage(ctx)
    stage.setup()
    assert stage.config == "config" and seen["train_iters"] == loaded.recipe.train.max_steps
    assert seen["data"]["training"]["rows"] == len(stage.data.train)
    assert (run.root / "megatron_data" / "training.idx.parquet").is_file()
    assert (run.root / "megatron_data" / "tokenizer" / "tokenizer_config.json").is_file()
    # ChatML's '\n' after '<|im_end|>' is not a target (the trained span ends at the turn end), so
    # Megatron, which trains nothing after EOS, drops no target.
    assert stage.data_stats["megatron_targets_dropped_after_eos"] == 0
    assert "megatron" not in sys.modules


def test_the_layer_spec_is_part_of_the_cache_key():
    te = cache_key("meta-llama/Llama-3.1-8B", None, False)
    assert te == cache_key("meta-llama/Llama-3.1-8B", None, False, "transformer_engine")  # keys written before
    assert cache_key("meta-llama/Llama-3.1-8B", None, False, "local") != te


@pytest.mark.parametrize("args,message", [
    (["--to-hf", "ckpt"], "add -o DIR"),
    (["--tensor-parallel", "2"], "add -o DIR"),
    (["-o", "out", "--tensor-parallel", "0"], "--tensor-parallel must be 1 or more"),
])
def test_convert_checkpoint_arguments_are_checked_first(tmp_path, monkeypatch, capsys, args, message):
    from pathlib import Path

    from recipeforge.cli import main

    monkeypatch.chdir(tmp_path)
    recipe = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny" / "pretrain.yaml"
    code = main(["convert-checkpoint", str(recipe), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
