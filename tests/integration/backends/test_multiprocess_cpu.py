"""Two CPU processes over gloo, through the real launchers: DDP, DeepSpeed ZeRO-2 and ZeRO-3 train the tiny
SFT recipe with the loss curve of one process (same global batch), final/ loads with plain transformers,
resume from a ZeRO-3 sharded checkpoint continues exactly, ZeRO-3 writes final/ a parameter at a time
(several files, bit-equal to its checkpoint's weights), ZeRO-3 with CPU optimizer and parameter
offload matches too, and DPO runs on two processes.

Each entry point is used once: `recipeforge train --nproc-per-node 2` (accelerate launch with a generated
config file), `torchrun -m recipeforge train` and `accelerate launch -m recipeforge train` directly.
DeepSpeed builds a small extension on first use (about a minute, once per machine: it is cached in
~/.cache/recipeforge/torch_extensions, or $TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.backends.deepspeed_ops import extensions_dir
from recipeforge.backends.launcher_command import launcher_command

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
DPO = REPO / "examples" / "yaml" / "tiny" / "dpo.yaml"
# The launchers of this Python, as recipeforge starts them: the script beside it, or `python -m ...` in a
# virtual environment on top of another one, whose bin/ has no launcher scripts.
TORCHRUN = launcher_command("torchrun", "torch.distributed.run")
ACCELERATE_LAUNCH = launcher_command("accelerate", "accelerate.commands.launch")
# Six steps of global batch 8 over 16 packed sequences: whole batches only (a ragged last batch is
# padded with repeated samples under data parallelism, which one process does not do).
VARIANT = ("train.max_steps=6", "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=3",
           "data.val_size=0")
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
TOL = 1e-3


def _run(cmd: list[str], cwd: Path, timeout: int = 480, env: dict | None = None) -> subprocess.CompletedProcess:
    # Under the tier's 600 s limit, so a launch that hangs fails with what it printed, not a stack of pytest.
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = lambda b: (b.decode(errors="replace") if isinstance(b, bytes) else b or "")[-6000:]  # noqa: E731
        pytest.fail(f"no end after {timeout} s: {cmd}\n--- stdout\n{out(exc.stdout)}\n--- stderr\n{out(exc.stderr)}")
    assert proc.returncode == 0, f"{cmd}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def _args(tiny, recipe: Path, run: Path, *overrides: str) -> list[str]:
    return [str(recipe), f"output.dir={run}", f"data.cache_dir={tiny.cache_dir}", "logging.progress_bar=false",
            *overrides]


def recipeforge(tiny, recipe, run, *overrides, nproc=2, timeout=480, env=None):
    return _run([sys.executable, "-m", "recipeforge", "train", *_args(tiny, recipe, run, *overrides),
                 "--nproc-per-node", str(nproc)], run.parent, timeout, env)


def _losses(tiny, run: Path) -> list[float]:
    return tiny.values(run, "loss")


def _observed(run: Path) -> dict:
    return json.loads((run / "backend.json").read_text())["observed"]


def _assert_same_curve(tiny, run: Path, reference: Path) -> None:
    mine, ref = _losses(tiny, run), _losses(tiny, reference)
    assert len(mine) == len(ref) == 6, (mine, ref)
    assert mine == pytest.approx(ref, abs=TOL), (mine, ref)
    assert mine[-1] < mine[0] - 0.5  # and it learns


def _assert_final_matches(run: Path, reference: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "final")     # plain transformers, no recipeforge
    ref = AutoModelForCausalLM.from_pretrained(reference / "final")
    mine, theirs = model.state_dict(), ref.state_dict()
    assert mine.keys() == theirs.keys()
    worst = max((mine[k].float() - theirs[k].float()).abs().max().item() for k in mine)
    assert worst < 1e-3, worst
    assert all(t.dtype == torch.float32 for t in mine.values())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multiprocess")


@pytest.fixture(scope="module")
def reference(tiny, workdir) -> Path:
    """One process, same recipe and global batch: the curve every backend must reproduce."""
    return tiny.train(str(SFT), workdir / "single", *VARIANT)


def test_ddp_through_the_recipeforge_launcher(tiny, workdir, reference):
    run = workdir / "ddp"
    proc = recipeforge(tiny, SFT, run, *VARIANT, "distributed.backend=ddp")
    assert "launching accelerate:" in proc.stderr and "--config_file" in proc.stderr
    assert (run / "accelerate_config.yaml").is_file() and not (run / "deepspeed.json").exists()
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["backend"], plan["world_size"], plan["micro_batch_size"] * plan["gradient_accumulation"]
            * plan["data_parallel"]) == ("ddp", 2, 8)
    seen = _observed(run)
    assert (seen["distributed_type"], seen["num_processes"], seen["process_group_backend"], seen["ddp"]) == \
        ("MULTI_CPU", 2, "gloo", True)
    _assert_same_curve(tiny, run, reference)
    _assert_final_matches(run, reference)
    assert proc.stdout.count("run written to") == 1  # the launching command reports, not every worker
    # A clean run: no worker ended badly, and outcome.json says it finished (test_unclean_exit_cpu.py has
    # the run whose worker is killed after it finished).
    assert "warning: a worker exited" not in proc.stderr
    assert json.loads((run / "outcome.json").read_text()) == {"kind": "finished", "message": "", "preempted": None,
                                                               "rank": 0, "version": 1}


@needs_deepspeed
def test_zero2_launched_directly_by_torchrun(tiny, workdir, reference):
    run = workdir / "zero2"
    _run([*TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "recipeforge", "train",
          *_args(tiny, SFT, run, *VARIANT, "distributed.backend=deepspeed", "distributed.zero_stage=2")], workdir)
    plan = json.loads((run / "plan.json").read_text())  # rank 0 planned for the launcher's world
    assert (plan["backend"], plan["preset"], plan["world_size"], plan["micro_batch_size"]) == ("deepspeed", "zero2", 2, 4)
    seen = _observed(run)
    assert (seen["engine"], seen["zero_stage"], seen["num_processes"], seen["distributed_type"]) == \
        ("DeepSpeedEngine", 2, 2, "DEEPSPEED")
    assert seen["partitioned_params"] == 0
    _assert_same_curve(tiny, run, reference)
    _assert_final_matches(run, reference)


@pytest.fixture(scope="module")
def zero3(tiny, workdir) -> Path:
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed")
    # Launched from this process (`Tiny.launch`): its tests read what the workers trained and wrote.
    return tiny.launch(str(SFT), workdir / "zero3", *VARIANT, "distributed.backend=deepspeed",
                       "distributed.zero_stage=3", "output.max_shard_size=200KB")


def test_zero3_shards_and_consolidates(tiny, zero3, reference):
    ds = json.loads((zero3 / "deepspeed.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["train_batch_size"] == 8
    seen = _observed(zero3)
    assert (seen["engine"], seen["zero_stage"], seen["num_processes"]) == ("DeepSpeedEngine", 3, 2)
    # every parameter is partitioned: this rank holds half of the elements
    assert seen["partitioned_params"] == 21 and seen["local_param_elements"] * 2 == seen["full_param_elements"]
    _assert_same_curve(tiny, zero3, reference)
    _assert_final_matches(zero3, reference)
    shards = sorted(p.name for p in (zero3 / "checkpoints" / "checkpoint-3" / "global_step3").iterdir())
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")]


def test_zero3_final_is_streamed_tensor_by_tensor(zero3):
    """final/ written a parameter at a time (each gathered alone), in files of at most 200 KB: bit-equal
    to the weights DeepSpeed's own zero_to_fp32 rebuilds from the last checkpoint, and rank 0's save
    peak within the plan's."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    from recipeforge.outputs.phase_memory import read
    from recipeforge.plan.phases import HOST_BAND

    files = sorted(p.name for p in (zero3 / "final").glob("*.safetensors"))
    assert len(files) >= 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors", files
    mine = AutoModelForCausalLM.from_pretrained(zero3 / "final").state_dict()
    ref = get_fp32_state_dict_from_zero_checkpoint(str(zero3 / "checkpoints" / "checkpoint-6"))
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in mine)
    planned = {p["phase"]: p for p in json.loads((zero3 / "plan.json").read_text())["extra"]["phases"]}["save"]
    assert planned["note"].startswith("streamed:"), planned
    measured = read(zero3)[0]["save"]["host_gb"]
    assert 0.1 < measured <= planned["host_per_process_gb"] * (1 + HOST_BAND), (measured, planned)


def test_resume_from_a_zero3_sharded_checkpoint(tiny, workdir, zero3):
    run = workdir / "zero3-resumed"
    shutil.copytree(zero3, run)
    shutil.rmtree(run / "checkpoints" / "checkpoint-6")
    shutil.rmtree(run / "final")
    proc = recipeforge(tiny, SFT, run, *VARIANT, "distributed.backend=deepspeed", "distributed.zero_stage=3")
    assert f"resuming from {run / 'checkpoints' / 'checkpoint-3'}" in proc.stderr
    assert [r["step"] for r in tiny.records(run, "train") if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert _losses(tiny, run) == pytest.approx(_losses(tiny, zero3), abs=1e-5)
    _assert_final_matches(run, zero3)


@needs_deepspeed
def test_zero3_with_optimizer_and_parameter_offload(tiny, workdir, reference, tmp_path):
    """Also: DeepSpeed's extensions in recipeforge's cache, each with the `lock` a build stopped half-way
    leaves (DeepSpeed alone waits on it for ever); the run removes them, says so, and trains."""
    run = workdir / "zero3-offload"
    cache = tmp_path / "cache"
    # as built by `python -m recipeforge.backends.deepspeed_ops` (.ci/tests)
    built = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or extensions_dir())
    for name in ("cpu_adam", "deepspeed_shm_comm"):
        if (built / name).is_dir():  # copied with their times, so they are not built again
            shutil.copytree(built / name, cache / "torch_extensions" / name, ignore=shutil.ignore_patterns("lock"))
        (cache / "torch_extensions" / name).mkdir(parents=True, exist_ok=True)
        (cache / "torch_extensions" / name / "lock").write_text("")
    env = {**{k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}, "RECIPEFORGE_CACHE": str(cache)}
    proc = recipeforge(tiny, SFT, run, *VARIANT, "distributed.backend=deepspeed",
                       "distributed.preset=zero3_offload_params", env=env)
    assert not list((cache / "torch_extensions").glob("*/lock"))
    assert proc.stderr.count("left by a build that stopped half-way") >= 2, proc.stderr[-3000:]
    zero = json.loads((run / "deepspeed.json").read_text())["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    seen = _observed(run)
    assert (seen["zero_stage"], seen["offload_optimizer"], seen["num_processes"]) == (3, True, 2)
    _assert_same_curve(tiny, run, reference)
    _assert_final_matches(run, reference)


def test_dpo_on_two_processes_launched_by_accelerate(tiny, workdir):
    single = tiny.train(str(DPO), workdir / "dpo-single", "train.max_steps=6", "train.micro_batch_size=auto",
                        "train.logging_steps=1")
    run = workdir / "dpo-ddp"
    _run([*ACCELERATE_LAUNCH, "--multi_gpu", "--num_processes", "2", "--main_process_port", "0",
          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "recipeforge", "train",
          *_args(tiny, DPO, run, "train.max_steps=6", "train.micro_batch_size=auto", "train.logging_steps=1")],
         workdir)
    seen = _observed(run)
    assert (seen["num_processes"], seen["ddp"]) == (2, True)
    assert _losses(tiny, run) == pytest.approx(_losses(tiny, single), abs=TOL)
    assert (run / "final" / "adapter_model.safetensors").is_file()


@needs_deepspeed
@pytest.mark.timeout(330)  # the merge used to hang for good
def test_lora_on_zero3_merges_after_training(tiny, workdir):
    # rank 0 merges alone after training: the base must load whole, not through ZeRO-3's collective
    # partitioning that the trainer's DeepSpeed config would otherwise switch on in that process
    # (launched from this process, `Tiny.launch`: the merge is the workers', not the command line's)
    run = tiny.launch(str(REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"), workdir / "zero3-lora-merged",
                      *VARIANT, "distributed.backend=deepspeed", "distributed.zero_stage=3",
                      "output.merge_adapter=true")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(run / "merged")
    assert merged.config.num_hidden_layers == 2 and not any("lora" in n for n, _ in merged.named_parameters())
