"""`recipeforge train --dry-run`: the exact launcher command, environment and generated files, for a
2-node x 8-GPU plan; nothing is started or written (that torch is never imported is
checked in a fresh interpreter: tests/commands/test_launch_dry_run.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from recipeforge.cli import main

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"   # hardware: 2 nodes x 8 H100
NODE = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29555"]


def dry_run(capsys, run_dir: Path, *overrides: str, recipe=RECIPE, flags=NODE) -> tuple[str, list[str], dict, dict]:
    """Run the CLI; returns (plan line, command, environment, files by name)."""
    code = main(["train", str(recipe), f"output.dir={run_dir}", *overrides, "--dry-run", *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    plan_line, sections, name = out.splitlines()[0], {}, None
    assert plan_line.startswith("# plan: ")
    for line in out.splitlines()[1:]:
        if line in ("# command", "# environment (added to the current one)") or line.startswith("# file "):
            name, sections[line] = line, []
        elif name is not None:
            sections[name].append(line)
    text = {k: "\n".join(v).strip() for k, v in sections.items()}
    command = shlex.split(text["# command"])
    env = dict(line.split("=", 1) for line in text["# environment (added to the current one)"].splitlines())
    files = {Path(k[7:]).name: (Path(k[7:]), v) for k, v in text.items() if k.startswith("# file ")}
    return plan_line, command, env, files


def test_deepspeed_dry_run_for_two_nodes_of_eight_gpus(tmp_path, capsys, monkeypatch):
    from recipeforge.backends.deepspeed_ops import extensions_dir
    from recipeforge.backends.launcher_command import launcher_command

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    run = tmp_path / "run"
    # ZeRO-3 with the optimizer on the CPU: what the planner itself picks for this recipe and target.
    plan_line, command, env, files = dry_run(capsys, run, "distributed.preset=zero3_offload")
    assert plan_line.startswith("# plan: deepspeed (zero3_offload), 2 node(s) x 8 GPUs = 16 processes")
    # accelerate's launcher of this Python: its `accelerate` script, or `python -m ...` where bin/ has none
    launcher = launcher_command("accelerate", "accelerate.commands.launch")
    assert command[:len(launcher)] == launcher and launcher[-1] in ("launch", "accelerate.commands.launch")
    command = command[len(launcher):]
    assert command[0:2] == ["--config_file", str(run / "accelerate_config.yaml")]
    assert command[2:8] == ["--machine_rank", "1", "--main_process_ip", "10.1.2.3", "--main_process_port", "29555"]
    spec_path, spec_text = files["worker.json"]  # the workers' one argument: the worker entry's spec
    assert command[8:] == ["-m", "recipeforge.run.worker", str(spec_path)]
    spec = json.loads(spec_text)
    assert spec["version"] == 2 and (spec["plan"], spec["run_dir"]) == (str(files["plan.json"][0]), str(run))
    assert (spec["recipe"], spec["overrides"]) == (str(RECIPE), [f"output.dir={run}", "distributed.preset=zero3_offload"])
    assert not any(k.startswith("RECIPEFORGE_") for k in env)
    # DeepSpeed's JIT-built extension is cached per machine, not per run
    assert env["TORCH_EXTENSIONS_DIR"] == extensions_dir() and "OMP_NUM_THREADS" not in env
    assert set(files) == {"plan.json", "worker.json", "deepspeed.json", "accelerate_config.yaml"}

    acc = yaml.safe_load(files["accelerate_config.yaml"][1])
    assert acc["distributed_type"] == "DEEPSPEED"
    assert (acc["num_processes"], acc["num_machines"], acc["rdzv_backend"]) == (16, 2, "static")
    assert acc["deepspeed_config"] == {"deepspeed_config_file": str(run / "deepspeed.json"), "zero3_init_flag": True,
                                       "deepspeed_multinode_launcher": "standard"}
    assert "mixed_precision" not in acc  # DeepSpeed takes precision from deepspeed.json only

    ds = json.loads(files["deepspeed.json"][1])
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 16 == 128
    zero = ds["zero_optimization"]
    assert ds["bf16"]["enabled"] is True and zero["stage3_gather_16bit_weights_on_model_save"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True} and "offload_param" not in zero
    # offloaded states are stepped by DeepSpeed's CPU Adam, with the trainer's settings
    assert ds["optimizer"] == {"type": "AdamW", "params": {"lr": 5e-6, "betas": [0.9, 0.999], "eps": 1e-8,
                                                           "weight_decay": 0.0}}
    assert not run.exists()  # a dry run writes nothing


def test_accelerate_reads_the_generated_config(tmp_path, capsys):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    run = tmp_path / "run"
    eight_b = RECIPE.with_name("llama3-8b-full-sft.yaml")
    _, _, _, files = dry_run(capsys, run, "hardware.nodes=2", "distributed.backend=fsdp",
                             "distributed.preset=fsdp_hybrid_shard", "train.gradient_checkpointing=true",
                             recipe=eight_b)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(files["accelerate_config.yaml"][1])
    cfg = load_config_from_file(str(path))
    assert cfg.distributed_type == "FSDP" and cfg.num_processes == 16 and cfg.num_machines == 2
    assert cfg.mixed_precision == "bf16"
    assert cfg.fsdp_config["fsdp_version"] == 2
    assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert cfg.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert cfg.fsdp_config["fsdp_activation_checkpointing"] is True   # the recipe sets gradient_checkpointing
    assert cfg.parallelism_config == {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 8}


def test_one_node_gets_a_free_port_and_a_cpu_world_splits_the_cores(tmp_path, capsys):
    tiny = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    code = main(["train", str(tiny), f"output.dir={tmp_path / 'run'}", "train.micro_batch_size=auto",
                 "--dry-run", "--nproc-per-node", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "# plan: ddp, 1 node(s) x 2 CPU processes = 2 processes; micro batch 4 x accumulation 1" in out
    assert "--main_process_port 0 -m recipeforge.run.worker " in out
    assert "OMP_NUM_THREADS=" in out and "distributed_type: MULTI_GPU" in out and "mixed_precision: 'no'" in out


def test_single_process_dry_run_says_it_trains_in_place(tmp_path, capsys):
    tiny = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    assert main(["train", str(tiny), f"output.dir={tmp_path / 'run'}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# plan: single") and "no launcher" in out


def test_megatron_without_its_packages_names_the_extra(tmp_path, capsys):
    from recipeforge.backends.megatron import megatron_installed

    if megatron_installed():
        pytest.skip("Megatron-Bridge is installed here")
    pretrain = ROOT / "examples" / "yaml" / "pretrain-llama3-405b.yaml"
    assert main(["train", str(pretrain), f"output.dir={tmp_path / 'run'}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "megatron backend needs Megatron-Bridge" in err and "pip install 'recipeforge[megatron]'" in err


def test_fsdp_on_the_cpu_launches_fsdp_and_refuses_what_it_cannot_do(tmp_path, capsys):
    """FSDP2 on two CPU processes is launched as FSDP (the workers name their state so that Accelerate
    shards, see backends/fsdp_run.py); its offload, which needs an accelerator, is refused before anything."""
    import yaml

    tiny = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    run = tmp_path / "run"
    assert main(["train", str(tiny), f"output.dir={run}", "train.micro_batch_size=auto",
                 "distributed.backend=fsdp", "--nproc-per-node", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# plan: fsdp (fsdp_full_shard), 1 node(s) x 2 CPU processes = 2 processes" in out
    config = yaml.safe_load(out.split("accelerate_config.yaml\n", 1)[1].split("\n# file ", 1)[0])
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 2
    assert config["fsdp_config"]["fsdp_version"] == 2 and config["mixed_precision"] == "no"
    code = main(["train", str(tiny), f"output.dir={run}", "train.micro_batch_size=auto",
                 "distributed.preset=fsdp_full_shard_offload", "--nproc-per-node", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "distributed.offload: the fsdp backend cannot offload optimizer+params on the CPU" in err
    assert not run.exists()


def test_a_multi_node_plan_needs_one_command_per_node(tmp_path, capsys):
    assert main(["train", str(RECIPE), f"output.dir={tmp_path / 'run'}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "hardware.nodes: the plan spans 2 nodes, and this command was started for 1" in err
    assert "--nnodes/--node-rank/--master-addr" in err and "launch --slurm" in err


def test_launchers_belong_to_this_python(monkeypatch, tmp_path):
    """A Python whose bin/ has no launcher script (a venv on top of another Python's packages) runs
    the launcher module itself: an `accelerate` found on PATH may start workers in another Python."""
    import sys

    from recipeforge.backends.launcher_command import launcher_command

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setattr(sys, "executable", str(python))
    assert launcher_command("accelerate", "accelerate.commands.launch") == [str(python), "-m", "accelerate.commands.launch"]
    assert launcher_command("torchrun", "torch.distributed.run") == [str(python), "-m", "torch.distributed.run"]
    (python.parent / "accelerate").write_text("")
    assert launcher_command("accelerate", "accelerate.commands.launch") == [str(python.parent / "accelerate"), "launch"]


@pytest.mark.parametrize("backend", ["ddp", "deepspeed", "fsdp"])
def test_workers_get_the_spec_path_and_the_flags_in_the_spec_nothing_else(tmp_path, capsys, monkeypatch, backend):
    """Launcher -> workers: the spec's path is the workers' one argument and no recipeforge value is in
    their environment; the launching command's --debug/--verbose/--trust-code travel in the spec."""
    for name in ("RECIPEFORGE_DEBUG", "RECIPEFORGE_VERBOSE", "RECIPEFORGE_TRUST_CODE"):
        # set (to "off") rather than deleted, so that monkeypatch restores them after `main` sets them
        monkeypatch.setenv(name, "0")
    recipe = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    code = main(["--debug", "--verbose", "--trust-code", "train", str(recipe), f"output.dir={tmp_path / 'run'}",
                 f"distributed.backend={backend}", "train.micro_batch_size=auto", "--nproc-per-node", "2",
                 "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    command = shlex.split(lines[lines.index("# command") + 1])
    # the launcher itself may be `python -m accelerate.commands.launch` (no `accelerate` script beside the
    # interpreter, as in a virtual environment over the system's packages): the worker's module comes last
    start = len(command) - 1 - command[::-1].index("-m")
    spec_path = tmp_path / "run" / "worker.json"
    assert command[start:] == ["-m", "recipeforge.run.worker", str(spec_path)]
    env_at = lines.index("# environment (added to the current one)") + 1
    env = dict(line.split("=", 1) for line in lines[env_at:lines.index("", env_at)])
    assert [k for k in env if k.startswith("RECIPEFORGE_")] == []
    spec_text = out.split(f"# file {spec_path}\n", 1)[1].split("\n# file", 1)[0]
    spec = json.loads(spec_text)
    assert set(spec) == {"plan", "run_dir", "outcome", "recipe", "overrides", "recipe_env", "settings", "version"}
    settings = spec["settings"]
    assert (settings["debug"], settings["verbose"], settings["trust_code"]) == (True, True, True)
