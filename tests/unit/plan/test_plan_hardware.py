"""Hardware specs, the accelerator table, the local probe (reading
`nvidia-smi`: tests/commands/test_plan_hardware.py) and where the planning target comes from."""

from __future__ import annotations


import pytest

from recipeforge.errors import RecipeError
from recipeforge.plan import ACCELERATORS, hardware, hardware_for, parse_hardware, probe_local_hardware


@pytest.mark.parametrize("spec, nodes, gpus, name", [
    ("8xH100-80GB", 1, 8, "H100-80GB"),
    ("2x8xA100-80GB", 2, 8, "A100-80GB"),
    ("1xL4-24GB", 1, 1, "L4-24GB"),
    ("h200-141gb", 1, 1, "H200-141GB"),
    ("4 x mi300x-192gb", 1, 4, "MI300X-192GB"),
    ("8xL4", 1, 8, "L4-24GB"),  # a family naming exactly one entry
])
def test_parse_specs(spec, nodes, gpus, name):
    hw = parse_hardware(spec)
    assert (hw.nodes, hw.gpus_per_node, hw.accelerator.name, hw.device) == (nodes, gpus, name, "cuda")
    assert hw.num_gpus == nodes * gpus
    assert hw.source == "--hardware"


def test_parse_cpu():
    hw = parse_hardware("cpu")
    assert hw.device == "cpu" and hw.gpus_per_node == 0 and hw.accelerator is None and hw.num_gpus == 0
    assert hw.describe() == "cpu"


def test_describe_round_trips():
    for spec in ("8xH100-80GB", "2x8xA100-80GB", "1xL4-24GB"):
        assert parse_hardware(parse_hardware(spec).describe()).describe() == spec


def test_unknown_accelerator_lists_known_ones():
    with pytest.raises(RecipeError) as err:
        parse_hardware("8xH100-8GB")
    problem = err.value.problems[0]
    assert "unknown accelerator 'H100-8GB'" in problem.message
    assert "did you mean 'H100-80GB'?" in problem.hint
    for name in ("A100-40GB", "L40S-48GB", "MI300X-192GB"):
        assert name in problem.hint


def test_ambiguous_family_asks_which():
    with pytest.raises(RecipeError) as err:
        parse_hardware("8xA100")
    assert "A100-80GB" in err.value.problems[0].hint and "A100-40GB" in err.value.problems[0].hint


@pytest.mark.parametrize("bad", ["0xH100-80GB", "8x", "x8xH100", "8xH100-80GB extra"])
def test_malformed_specs(bad):
    with pytest.raises(RecipeError):
        parse_hardware(bad)


def test_table_has_the_issue_accelerators():
    for name in ("H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L40S-48GB", "L4-24GB", "A10G-24GB",
                 "RTX4090-24GB", "V100-32GB", "MI300X-192GB", "B200-180GB"):
        acc = ACCELERATORS[name]
        assert acc.memory_gb > 10 and acc.peak_tflops > 0
    assert not ACCELERATORS["V100-32GB"].bf16 and ACCELERATORS["A100-80GB"].bf16
    assert ACCELERATORS["H100-80GB"].fp8 and not ACCELERATORS["A100-80GB"].fp8


def test_hardware_precedence(recipe):
    r = recipe(hardware={"nodes": 2, "gpus_per_node": 4, "gpu": "A100-40GB"})
    assert hardware_for(r, "8xH100-80GB").describe() == "8xH100-80GB"          # the CLI spec wins
    from_recipe = hardware_for(r, None)
    assert from_recipe.describe() == "2x4xA100-40GB" and from_recipe.source == "recipe"
    cpu = hardware_for(recipe(hardware={"gpus_per_node": 0}), None)
    assert cpu.device == "cpu" and cpu.source == "recipe"


def test_recipe_unknown_gpu_names_the_key(recipe):
    with pytest.raises(RecipeError) as err:
        hardware_for(recipe(hardware={"gpus_per_node": 1, "gpu": "H1000"}), None)
    assert err.value.problems[0].key == "hardware.gpu"


def test_probe_without_gpus_is_cpu(monkeypatch):
    for probe in ("_probe_nvml", "_probe_nvidia_smi", "_probe_torch"):
        monkeypatch.setattr(hardware, probe, lambda: None)
    hw = probe_local_hardware()
    assert hw.device == "cpu" and hw.gpus_per_node == 0 and hw.source == "probe"
    assert hw.cpu_ram_gb is None or hw.cpu_ram_gb > 0


def test_probe_survives_broken_tools(monkeypatch):
    def boom():
        raise OSError("driver exploded")
    for probe in ("_probe_nvml", "_probe_nvidia_smi", "_probe_torch"):
        monkeypatch.setattr(hardware, probe, boom)
    assert probe_local_hardware().device == "cpu"


def test_probe_keeps_unknown_gpus(monkeypatch):
    monkeypatch.setattr(hardware, "_probe_nvml", lambda: [("NVIDIA Future GPU", 200.0, 12)])
    hw = probe_local_hardware()
    assert hw.accelerator.name == "NVIDIA Future GPU" and hw.accelerator.bf16 and hw.gpu_memory_gb == 200.0


def test_probe_does_not_import_torch_without_a_driver(monkeypatch):
    monkeypatch.setattr(hardware.os.path, "exists", lambda path: False)
    assert hardware._probe_torch() is None


def test_unknown_host_ram_is_assumed_from_gpu_memory():
    hw = parse_hardware("8xH100-80GB")
    ram, known = hw.host_ram_gb()
    assert not known and ram == pytest.approx(2 * 8 * 79.6)
    assert parse_hardware("1xL4-24GB").host_ram_gb()[0] == 128.0
