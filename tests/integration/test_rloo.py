"""RLOO end to end on the tiny model: the mean reward rises, and an impossible batch geometry is
refused at its key before anything loads."""

from __future__ import annotations

import statistics

import pytest

from recipeforge.cli import main

pytestmark = pytest.mark.slow


def test_rloo_mean_reward_rises(tiny, tmp_path):
    run = tiny.train("rloo", tmp_path / "run")
    reward = tiny.values(run, "reward")
    assert len(reward) >= 6
    assert statistics.fmean(reward[-2:]) > statistics.fmean(reward[:2]) + 0.5, reward
    last = tiny.records(run, "train")[-1]
    assert "rewards/length/mean" in last and "rewards/exact_match/mean" in last
    assert "model.safetensors" in tiny.files(run / "final")
    assert "trained with RLOO" in (run / "README.md").read_text()


def test_rloo_global_batch_not_divisible_by_the_group_is_refused_at_its_key(tiny, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {tiny.recipes / 'rloo.yaml'}\nrloo: {{num_generations: 3}}\n"
                           "train: {global_batch_size: 8, micro_batch_size: 4}\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:3:9 train.global_batch_size: RLOO needs a global batch divisible by rloo.num_generations " \
           "(8 % 3 != 0)" in err, err
    assert "use a multiple of 3, e.g. 6" in err

