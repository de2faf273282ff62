"""The Ray launcher without Ray: `distributed.launcher` / `ray_address` and their rules, the address's
precedence, `launch --ray --dry-run` (the job the driver would submit, for a 2-node x 8-GPU plan and a
CPU plan; that neither Ray nor torch is imported: tests/commands/test_ray_launch.py), the short error
without Ray installed, and the launch flags of one target refused with another. The launch itself is
tests/integration/backends/test_ray_launch_cpu.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recipeforge.cli import main

ROOT = Path(__file__).resolve().parents[3]
BIG = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"   # hardware: 2 nodes x 8 H100
TINY = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def _recipe(tmp_path: Path, distributed: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: [{TINY}]\ndistributed: {distributed}\n")
    return path


def _validate(capsys, path: Path) -> tuple[int, str]:
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_launcher_defaults_to_auto_and_takes_ray(tmp_path, capsys):
    from recipeforge.config import load_recipe

    assert load_recipe(str(TINY), []).recipe.distributed.launcher == "auto"
    recipe = load_recipe(str(_recipe(tmp_path, "{launcher: ray, ray_address: 'ray://head:10001'}")), []).recipe
    assert (recipe.distributed.launcher, recipe.distributed.ray_address) == ("ray", "ray://head:10001")
    code, out = _validate(capsys, _recipe(tmp_path, "{launcher: slurm}"))
    assert code == 2 and "distributed.launcher" in out


@pytest.mark.parametrize("distributed, key, message", [
    ("{ray_address: '10.0.0.1:6379'}", "distributed.ray_address", "is read only with distributed.launcher: ray"),
    ("{launcher: ray, ray_address: head}", "distributed.ray_address", "'head' is not a Ray cluster address"),
    ("{launcher: ray, rdzv_backend: c10d}", "distributed.rdzv_backend", "has no effect with launcher: ray"),
    ("{launcher: ray, rdzv_id: job}", "distributed.rdzv_id", "has no effect with launcher: ray"),
])
def test_ray_rules_point_at_the_key(tmp_path, capsys, distributed, key, message):
    code, out = _validate(capsys, _recipe(tmp_path, distributed))
    assert code == 2 and f"{key}: {message}" in out, out


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "head-node:6379", "ray://head:10001", "ray://head"])
def test_ray_addresses_accepted(tmp_path, capsys, address):
    code, out = _validate(capsys, _recipe(tmp_path, f"{{launcher: ray, ray_address: '{address}'}}"))
    assert code == 0, out


def test_address_from_flag_then_recipe_then_environment_then_auto(tmp_path, monkeypatch):
    from recipeforge.backends.ray_launch import ray_address
    from recipeforge.config import load_recipe

    plain = load_recipe(str(TINY), []).recipe
    pinned = load_recipe(str(_recipe(tmp_path, "{launcher: ray, ray_address: '10.0.0.1:6379'}")), []).recipe
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(plain) == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "ray://env-head:10001")
    assert ray_address(plain) == "ray://env-head:10001"
    assert ray_address(pinned) == "10.0.0.1:6379"
    assert ray_address(pinned, "10.9.9.9:6379") == "10.9.9.9:6379"


def _dry_run(capsys, *args: str) -> tuple[str, dict]:
    code = main(["launch", "--ray", *args, "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    return out, _job(out)


def _job(out: str) -> dict:
    """The ray_job.json the dry run prints (its `# file` section)."""
    text = out.split("/ray_job.json\n{", 1)[1]
    return json.loads("{" + text[:text.index("\n}\n") + 2])


def test_dry_run_of_two_nodes_of_eight_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = tmp_path / "run"
    out, job = _dry_run(capsys, str(BIG), f"output.dir={run}", "distributed.max_restarts=3",
                        "--ray-address", "ray://head:10001")
    assert out.startswith("# plan: deepspeed")
    command = out.split("# command\n", 1)[1].splitlines()[0].split()
    assert command[1:] == ["-m", "recipeforge.ray_entry", str(run / "ray_job.json")]
    assert job["address"] == "ray://head:10001" and job["num_workers"] == 16  # one Ray worker per planned process
    assert job["use_gpu"] and job["resources_per_worker"] == {"CPU": 1.0, "GPU": 1.0}
    assert (job["torch_backend"], job["max_failures"], job["timeout_s"]) == ("nccl", 3, 3600)
    assert job["worker_argv"] == [str(run / "worker.json")]  # the worker entry's one argument
    assert not any(k.startswith("RECIPEFORGE_") for k in job["worker_env"])
    assert job["accelerate_argv"][:2] == ["--config_file", str(run / "accelerate_config.yaml")]
    assert job["storage_path"] == str(run / "ray") and job["spec_path"] == str(run / "worker.json")
    assert not run.exists()  # a dry run writes nothing


def test_dry_run_of_a_cpu_recipe_from_the_recipe_key(tmp_path, capsys, monkeypatch):
    """`distributed.launcher: ray` makes `train` launch through Ray as `launch --ray` does."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    run = tmp_path / "run"
    code = main(["train", str(_recipe(tmp_path, "{launcher: ray, backend: ddp}")), f"output.dir={run}",
                 "train.micro_batch_size=auto", "--nproc-per-node", "2", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    job = _job(out)
    assert (job["address"], job["num_workers"], job["use_gpu"]) == ("127.0.0.1:6379", 2, False)
    assert job["resources_per_worker"] == {"CPU": 1.0} and job["torch_backend"] == "gloo"
    assert "OMP_NUM_THREADS" not in job["worker_env"]  # Ray sets the threads of a worker from its CPUs


def test_without_ray_a_short_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    for argv in (["launch", "--ray", str(TINY), f"output.dir={tmp_path / 'a'}"],
                 ["train", str(_recipe(tmp_path, "{launcher: ray}")), f"output.dir={tmp_path / 'b'}"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "launching through Ray needs Ray Train, which is not installed" in err
        assert "pip install 'recipeforge[ray]'" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("argv, message", [
    (["--ray", "--image", "x"], "--image is for launch --k8s only, not --ray"),
    (["--slurm", "--ray-address", "auto"], "--ray-address is for launch --ray only, not --slurm"),
    (["--k8s", "--overwrite"], "--overwrite is for launch --ray only, not --k8s"),
    (["--ray", "-o", "x.yaml", "--master-port", "29400"],
     "-o/--output and --master-port are for launch --slurm and --k8s, not --ray"),
])
def test_flags_of_another_launch_target_are_refused(tmp_path, capsys, argv, message):
    assert main(["launch", str(TINY), *argv]) == 2
    assert message in capsys.readouterr().err


def test_launch_targets_are_exclusive(capsys):
    with pytest.raises(SystemExit):
        main(["launch", str(TINY), "--ray", "--slurm"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_workers_get_the_environment_accelerate_launch_would_give_them(tmp_path, capsys, monkeypatch):
    """The driver derives accelerate's worker environment from the launch's own config file (here
    DeepSpeed ZeRO-3), less the process layout Ray sets and this machine's module path."""
    from recipeforge.backends.ray_driver import accelerate_env
    from recipeforge.backends.ray_launch import RayJob

    run = tmp_path / "run"
    out, _ = _dry_run(capsys, str(BIG), f"output.dir={run}", "distributed.preset=zero3_offload")
    for section in out.split("\n# file ")[1:]:  # what the launch would write, as written
        path, _, text = section.partition("\n")
        if not path.endswith("plan.json"):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text.rstrip("\n") + "\n")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    env = accelerate_env(RayJob.read(run / "ray_job.json").accelerate_argv)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(run / "deepspeed.json")
    assert not {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PYTHONPATH"} & set(env)
    assert accelerate_env([]) == {}  # a torchrun launch (Megatron): nothing to add


def test_an_address_nothing_answers_at_is_said_in_seconds():
    """`ray.init` waits minutes on a head that does not answer; the driver's TCP check says so first."""
    import socket

    from recipeforge.backends.ray_driver import unreachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert unreachable(f"127.0.0.1:{port}") is None and unreachable(f"ray://127.0.0.1:{port}") is None
    assert f"nothing answers at 127.0.0.1:{port}" in unreachable(f"127.0.0.1:{port}")
