"""Running out of memory mid-run is a user error (exit 2) with the plan's numbers, not a traceback,
and the run stays resumable from its last complete checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.cli import main

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"
pytestmark = pytest.mark.slow


def _args(tmp_path) -> list[str]:
    return ["train", str(TINY / "pretrain.yaml"), f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'c'}",
            "logging.progress_bar=false", "train.max_steps=6", "output.save_steps=2", "data.val_size=0"]


def test_out_of_memory_is_answered_with_the_plan_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    # torch's own OutOfMemoryError, raised inside the training step after 3 optimizer steps.
    monkeypatch.setenv("RECIPEFORGE_FAULT", "oom:3")
    assert main(_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "error: out of memory at step 3: the plan estimated " in err
    assert "GB per process (weights " in err and ", and the run needed more than " in err
    assert "hint: what would fit: " in err
    assert "Complete checkpoints are kept (checkpoints/checkpoint-2): change the recipe and rerun with --force" in err
    run = tmp_path / "run"
    assert not (run / "final").exists() and (run / "checkpoints" / "checkpoint-2").is_dir()

    monkeypatch.delenv("RECIPEFORGE_FAULT")
    assert main(_args(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "resuming from" in err and "checkpoint-2" in err
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.gpu
def test_real_cuda_out_of_memory_is_a_user_error(tiny, tmp_path):
    """The caching allocator itself refuses: the process may use a few MiB of the GPU only."""
    import torch

    from recipeforge.plan.oom import OutOfMemory

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * 2**20 / total, 0)
    try:
        with pytest.raises(OutOfMemory) as info:
            tiny.train("pretrain", tmp_path / "run", "hardware.gpus_per_node=1", "hardware.gpu=H100-80GB",
                       "train.max_steps=4", "data.val_size=0")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    (problem,) = info.value.problems
    assert problem.message.startswith("out of GPU memory ")
    assert "the plan estimated" in problem.message and problem.hint.startswith("what would fit: ")
