"""Tensor / context / replicate / shard sizes of a plan as the settings of the libraries that run them:
accelerate's ParallelismConfig (object and config-file keys, read back by accelerate's own loader),
transformers' DistributedConfig, the FSDP backend's trainer arguments, the dry run and the sbatch script."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.backends import parallelism
from recipeforge.backends.fsdp import FSDPBackend
from recipeforge.cli import main
from recipeforge.config import load_recipe
from recipeforge.plan import make_plan, parse_hardware

ROOT = Path(__file__).resolve().parents[3]
CP = ROOT / "examples" / "yaml" / "llama3-8b-32k-sft-cp.yaml"
TP = ROOT / "examples" / "yaml" / "llama3-70b-sft-tp-fsdp.yaml"


def _plan(path: Path, *overrides: str, spec: str | None = None):
    loaded = load_recipe(path, list(overrides))
    hw = parse_hardware(spec) if spec else None
    return make_plan(loaded.recipe, hw) if hw else make_plan(loaded.recipe), loaded.recipe


@pytest.mark.parametrize("path, overrides, spec, pc, dc, distributed_type", [
    # context parallel on one node: accelerate's FSDP2 plugin with cp_size
    (CP, (), None, {"dp_replicate_size": 1, "dp_shard_size": 4, "cp_size": 2, "cp_backend": "torch"}, None, "FSDP"),
    # context parallel with a replica per node (hybrid sharding)
    (CP, ("distributed.data_parallel_replicate=2", "distributed.context_parallel=2"), "2x8xH100-80GB",
     {"dp_replicate_size": 2, "dp_shard_size": 4, "cp_size": 2, "cp_backend": "torch"}, None, "FSDP"),
    # tensor parallel x FSDP2 over four nodes: transformers shards at load, accelerate runs MULTI_GPU
    (TP, (), None, {"dp_replicate_size": 1, "dp_shard_size": 16, "tp_size": 2},
     {"tp_size": 2, "fsdp_size": 16, "dp_replicate_size": 1}, "MULTI_GPU"),
    # tensor parallel with replicas: transformers' mesh keeps them; accelerate sees every DP rank as dp_shard
    (TP, ("model.name_or_path=meta-llama/Llama-3.1-8B", "distributed.tensor_parallel=2",
          "distributed.data_parallel_replicate=4"), None,
     {"dp_replicate_size": 1, "dp_shard_size": 16, "tp_size": 2},
     {"tp_size": 2, "fsdp_size": 4, "dp_replicate_size": 4}, "MULTI_GPU"),
])
def test_every_layout_translates_to_accelerate_and_transformers(tmp_path, path, overrides, spec, pc, dc,
                                                                 distributed_type):
    from accelerate import ParallelismConfig
    from accelerate.commands.config.config_args import load_config_from_file
    from transformers.distributed.configuration_utils import DistributedConfig

    from recipeforge.backends.launch import accelerate_config_text

    plan, recipe = _plan(path, *overrides, spec=spec)
    assert parallelism.parallelism_config_kwargs(plan) == pc
    assert parallelism.distributed_config_kwargs(plan) == dc
    # the real objects accept the sizes, and their product is the plan's world
    assert ParallelismConfig(**pc).total_size == plan.world_size
    if dc:
        d = DistributedConfig(**dc)
        assert d.tp_size * d.dp_size == plan.world_size
    # the launch file, read back by accelerate's own config loader
    section = FSDPBackend().accelerate_config(plan, recipe, tmp_path)
    assert section["distributed_type"] == distributed_type
    if distributed_type == "FSDP":
        assert section["fsdp_config"]["fsdp_version"] == 2
    file = tmp_path / "accelerate_config.yaml"
    file.write_text(accelerate_config_text(plan, section))
    loaded = load_config_from_file(str(file))
    assert loaded.parallelism_config == {f"parallelism_config_{k}": v for k, v in pc.items()}
    assert loaded.num_processes == plan.world_size and loaded.num_machines == plan.nodes


def test_plain_fsdp_plans_need_no_parallelism_config():
    plan, recipe = _plan(ROOT / "examples" / "yaml" / "llama3-8b-full-sft.yaml", "distributed.backend=fsdp")
    assert parallelism.parallelism_config_kwargs(plan) is None
    assert "parallelism_config" not in FSDPBackend().accelerate_config(plan, recipe, Path("."))


def test_trainer_arguments_for_context_and_tensor_parallel():
    from accelerate import ParallelismConfig

    backend = FSDPBackend()
    plan, recipe = _plan(CP)
    kwargs = backend.trainer_kwargs(SimpleNamespace(plan=plan, recipe=recipe))
    assert kwargs["fsdp"] is True and kwargs["fsdp_config"]["version"] == 2
    assert isinstance(kwargs["parallelism_config"], ParallelismConfig)
    assert (kwargs["parallelism_config"].cp_size, kwargs["parallelism_config"].dp_shard_size) == (2, 4)

    plan, recipe = _plan(TP)
    kwargs = backend.trainer_kwargs(SimpleNamespace(plan=plan, recipe=recipe))
    assert "fsdp" not in kwargs and kwargs["save_only_model"] is True  # the model is sharded at load
    assert (kwargs["parallelism_config"].tp_size, kwargs["parallelism_config"].dp_shard_size) == (2, 16)
    hooks = backend.setup_worker(SimpleNamespace(plan=plan, recipe=recipe))
    assert callable(hooks.load_sharded)  # the stage loads the model through the tensor-parallel loader


@pytest.mark.parametrize("path, flags, expect", [
    (CP, [], ["distributed_type: FSDP", "fsdp_version: 2", "parallelism_config_cp_size: 2",
              "# Mesh: replicate 1 x shard 4 x tensor 1 x context 2 = 8 processes"]),
    (TP, ["--nnodes", "4", "--node-rank", "2", "--master-addr", "10.0.0.1"],
     ["distributed_type: MULTI_GPU", "parallelism_config_tp_size: 2", "parallelism_config_dp_shard_size: 16",
      "transformers DistributedConfig at load"]),
])
def test_dry_run_shows_the_mesh(tmp_path, capsys, path, flags, expect):
    assert main(["train", str(path), f"output.dir={tmp_path / 'run'}", "--dry-run", *flags]) == 0
    out = capsys.readouterr().out
    for text in expect:
        assert text in out, text
    if flags:
        assert "--machine_rank 2 --main_process_ip 10.0.0.1" in out


@pytest.mark.parametrize("path, nodes, lines", [
    (CP, 1, ["accelerate parallelism_config: parallelism_config_dp_replicate_size=1, "
             "parallelism_config_dp_shard_size=4, parallelism_config_cp_size=2, parallelism_config_cp_backend=torch"]),
    (TP, 4, ["transformers DistributedConfig: tp_size=2, fsdp_size=16, dp_replicate_size=1",
             "accelerate parallelism_config: parallelism_config_dp_replicate_size=1, "
             "parallelism_config_dp_shard_size=16, parallelism_config_tp_size=2"]),
])
def test_sbatch_script_carries_the_layout(tmp_path, path, nodes, lines):
    run = tmp_path / "run"
    assert main(["launch", "--slurm", str(path), f"output.dir={run}"]) == 0
    script = (run / "slurm.sbatch").read_text()
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --gpus-per-node=8" in script
    for line in lines:
        assert f"# {line}" in script, line
