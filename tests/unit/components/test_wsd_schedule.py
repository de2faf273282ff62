"""`scheduler: wsd`: one definition of warmup, stable and decay phases for every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.components.schedules import WSDPhases, wsd_factor, wsd_phases

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "yaml"


def test_phases_split_the_total():
    assert wsd_phases(100, 10, 0.1) == WSDPhases(warmup=10, stable=80, decay=10)
    assert wsd_phases(25, 0, 0.1) == WSDPhases(warmup=0, stable=22, decay=3)  # 2.5 rounds up
    assert wsd_phases(18, 2, 0.25) == WSDPhases(warmup=2, stable=11, decay=5)  # 4.5 rounds up
    assert wsd_phases(7, 0, 0.01) == WSDPhases(warmup=0, stable=6, decay=1)    # at least one decay step
    assert wsd_phases(10, 0, 0.0) == WSDPhases(warmup=0, stable=10, decay=0)   # ratio 0: no decay
    assert wsd_phases(10, 8, 0.5) == WSDPhases(warmup=8, stable=0, decay=2)    # warmup first, decay gets the rest
    assert wsd_phases(3, 5, 0.5) == WSDPhases(warmup=3, stable=0, decay=0)
    for total in range(0, 60):
        for warmup in (0, 1, 5):
            assert wsd_phases(total, warmup, 0.3).total == total
    with pytest.raises(ValueError):
        wsd_phases(10, 0, 1.5)


def test_factor_matches_transformers_wsd_schedule():
    """The trainers' scheduler follows `wsd_factor`; it is the transformers formula step by step."""
    import torch
    from transformers.optimization import get_wsd_schedule

    phases = wsd_phases(40, 4, 0.25)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_wsd_schedule(opt, num_warmup_steps=4, num_decay_steps=phases.decay, num_training_steps=40,
                           decay_type="cosine")
    expected = [ref.lr_lambdas[0](s) for s in range(45)]
    assert [wsd_factor(s, phases) for s in range(45)] == pytest.approx(expected)


def test_factor_boundaries():
    phases = wsd_phases(20, 4, 0.25)  # warmup 0-3, stable 4-14, decay 15-19
    f = [wsd_factor(s, phases) for s in range(21)]
    assert f[:4] == pytest.approx([0, 0.25, 0.5, 0.75])
    assert f[4:16] == [1.0] * 12  # stable 4-14; the decay starts from the peak at step 15
    assert all(a > b for a, b in zip(f[15:20], f[16:21]))
    assert f[20] == 0.0  # the rate after the last step


def test_megatron_gets_the_same_phases(load_example, tmp_path):
    from recipeforge.backends.megatron_config import megatron_config
    from recipeforge.plan import make_plan

    loaded = load_example("pretrain-llama3-405b", "train.scheduler=wsd", "train.warmup_steps=50",
                          "train.decay_ratio=0.2")
    # What `components.megatron_data.write_megatron_data` returns (the paths are not read).
    data = {"root": str(tmp_path / "d"), "metadata": str(tmp_path / "d" / "pack_metadata.json"),
            "training": {"parquet": str(tmp_path / "d" / "training.idx.parquet"), "rows": 100}}
    cfg = megatron_config(make_plan(loaded.recipe), loaded.recipe, run_dir=tmp_path, data=data, train_iters=1000)
    s = cfg["scheduler"]
    phases = wsd_phases(1000, 50, 0.2)
    assert s["lr_decay_style"] == "WSD" and s["lr_decay_iters"] == 1000
    assert (s["lr_warmup_iters"], s["lr_wsd_decay_iters"], s["lr_wsd_decay_style"]) == (50, 200, "cosine")
    # Megatron holds the peak until lr_decay_iters - lr_wsd_decay_iters: the stable phase.
    assert s["lr_decay_iters"] - s["lr_wsd_decay_iters"] - s["lr_warmup_iters"] == phases.stable == 750


@pytest.fixture
def load_example(tmp_path):
    from recipeforge.config import load_recipe

    def _load(name: str, *overrides: str):
        return load_recipe(EXAMPLES / f"{name}.yaml", [f"output.dir={tmp_path / 'run'}", *overrides])

    return _load
