"""Liger's fused linear cross-entropy is refused at `validate` for the stages whose trainer refuses it,
and that list (`REFUSED_BY_TRAINER`) is checked against the installed TRL, not guessed: with
liger-kernel installed the real trainers are built with it; without, their source is read for the
guard that raises."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.stages import RUNNERS, runner_class
from recipeforge_liger import REFUSED_BY_TRAINER

RECIPES = {
    "pretrain": "stage: pretrain\ndata: {datasets: [{path: d.jsonl, format: text}]}\n",
    "sft": "stage: sft\ndata: {datasets: [{path: d.jsonl, format: alpaca}]}\n",
    "dpo": "stage: dpo\ndata: {datasets: [{path: d.jsonl, format: preference}]}\n",
    "grpo": "stage: grpo\ndata: {datasets: [{path: d.jsonl, format: prompt}]}\ngrpo: {rewards: [{name: length}]}\n",
    "rloo": "stage: rloo\ndata: {datasets: [{path: d.jsonl, format: prompt}]}\nrloo: {rewards: [{name: length}]}\n",
    "orpo": "stage: orpo\ndata: {datasets: [{path: d.jsonl, format: preference}]}\n",
    "kto": "stage: kto\ndata: {datasets: [{path: d.jsonl, format: unpaired}]}\n",
    "cpo": "stage: cpo\ndata: {datasets: [{path: d.jsonl, format: preference}]}\n",
    "reward": "stage: reward\ndata: {datasets: [{path: d.jsonl, format: preference}]}\n",
}
FLCE = "kernels:\n  liger: {fused_linear_cross_entropy: true}\n"
# The guard TRL 1.x trainers carry in their constructor.
GUARD = re.compile(r'liger_kernel_config\.get\("fused_linear_cross_entropy"\)\s*:\s*raise ValueError')


def _trainer(stage: str):
    module, _, name = runner_class(stage).trainer_class.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("stage", sorted(RECIPES))
def test_validate_refuses_it_exactly_for_the_refusing_stages(tmp_path, stage):
    path = tmp_path / "r.yaml"
    text = "model: {name_or_path: tiny:llama}\n" + RECIPES[stage] + FLCE
    path.write_text(text)
    refusing = REFUSED_BY_TRAINER["fused_linear_cross_entropy"]
    if stage not in refusing:
        load_recipe(path)
        return
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    (problem,) = info.value.problems
    assert problem.key == "kernels.liger.fused_linear_cross_entropy"
    assert problem.location is not None and problem.location.line == text.splitlines().index(FLCE.splitlines()[1]) + 1
    assert refusing[stage] in problem.message and "drop kernels.liger.fused_linear_cross_entropy" in problem.hint


def test_the_refusing_stages_are_the_ones_trl_refuses():
    refusing = REFUSED_BY_TRAINER["fused_linear_cross_entropy"]
    for stage in RUNNERS:
        trainer = _trainer(stage)
        source = "".join(inspect.getsource(k.__init__) for k in trainer.__mro__ if "__init__" in vars(k)
                         and k.__module__.split(".")[0] in ("trl", "transformers"))
        refuses = bool(GUARD.search(" ".join(source.split())))
        assert refuses is (stage in refusing), (
            f"{runner_class(stage).trainer_class} {'refuses' if refuses else 'accepts'} fused_linear_cross_entropy "
            f"in the installed version; update REFUSED_BY_TRAINER")
        if refuses:
            assert refusing[stage] == runner_class(stage).trainer_class


# liger-kernel is a GPU package (Triton kernels); where it is installed, the real trainers are asked.
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
@pytest.mark.parametrize("stage", sorted(REFUSED_BY_TRAINER["fused_linear_cross_entropy"]))
def test_the_real_trainer_refuses_it_gpu(tmp_path, stage):
    from datasets import Dataset
    from trl import DPOConfig, GRPOConfig

    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("tiny:llama")
    model = load_model("tiny:llama", tokenizer, device="cpu", dtype="fp32", attn_implementation="eager",
                       trust_remote_code=False, seed=0)
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], use_liger_kernel=True,
                  liger_kernel_config={"fused_linear_cross_entropy": True})
    if stage == "dpo":
        rows = Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}] * 2)
        build = lambda: _trainer("dpo")(model=model, args=DPOConfig(**common), train_dataset=rows,  # noqa: E731
                                        processing_class=tokenizer)
    else:
        rows = Dataset.from_list([{"prompt": "a"}] * 2)
        build = lambda: _trainer("grpo")(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),  # noqa: E731
                                         args=GRPOConfig(**common, num_generations=2, per_device_train_batch_size=2),
                                         train_dataset=rows, processing_class=tokenizer)
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):
        build()
