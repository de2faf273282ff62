"""Every command and flag on recipes shaped the way users write them.

The project's examples all set `hardware:` and fill every section; users' recipes do not. Here the
shapes come from three places: a corpus of recipes written like users' (tests/data/user_recipes),
generated recipes (stage, model and data only, then with or without each optional section, written as
a mapping, left empty or with its lines commented out, and split over `extends:`), and the Axolotl
configs of tests/data/axolotl converted by `recipeforge convert axolotl`. Each command x flag that
makes sense for a shape ends in exit 0, or in exit 2 with a located one-line error; never an internal
error or a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipeforge.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "user_recipes"
AXOLOTL = REPO / "tests" / "data" / "axolotl"
DATA = REPO / "examples" / "data"

# `error: <where> <key>: message`, or `error: N problems:` followed by such lines. <where> is a
# file:line:col, a <cli ...> or <env ...> argument, or nothing when only a key locates it.
LOCATED = re.compile(r"^(?:\S+:\d+:\d+ |<(?:cli|env) [^>]*> )?[\w.\[\]\-]+: \S")


def run(capsys, argv: list[str], env: dict | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """`recipeforge ARGV` in this process, with `env` added; the environment is put back afterwards
    (the CLI records flags such as --trust-code there for the processes it starts)."""
    import os

    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_answered(code: int, err: str, argv: list[str]) -> None:
    """Exit 0, or exit 2 with every problem located; never an internal error."""
    assert code in (0, 2), f"{argv}: exit {code}\n{err}"
    assert "Traceback" not in err and "internal error" not in err, f"{argv}\n{err}"
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert lines, f"{argv}\n{err}"
        first = lines[0][len("error: "):]
        if re.match(r"\d+ problems:$", first):
            body = err.split(first, 1)[1].strip().splitlines()
            problems = [line for line in body if not line.startswith("  ")]
            assert problems and all(LOCATED.match(p) for p in problems), f"{argv}\n{err}"
        else:
            assert LOCATED.match(first), f"{argv}: not located\n{err}"


# ----------------------------------------------------------------------------- the commands

HARDWARE = ("1xH100-80GB", "8xH100-80GB", "2x8xA100-80GB", "1xRTX4090-24GB", "cpu")


def command_lines(recipe: str, tmp: Path) -> list[list[str]]:
    """Each command with each flag combination that makes sense for one recipe file."""
    lines = [["validate", recipe], ["resolve", recipe], ["resolve", "--lock", recipe], ["plan", recipe],
             ["plan", recipe, "--json"], ["plan", recipe, "--nproc-per-node", "2"], ["plan", recipe, "--nnodes", "2"],
             ["plan", recipe, "--hardware", "8xH100-80GB", "--nnodes", "2"],
             ["plan", recipe, "--hardware", "cpu", "--nproc-per-node", "2"],
             ["train", recipe, "--dry-run"], ["train", recipe, "--dry-run", "--nproc-per-node", "2"],
             ["train", recipe, "--dry-run", "--strict"], ["train", recipe, "--dry-run", "train.seed=7"],
             ["train", recipe, "--dry-run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1"],
             ["launch", "--slurm", recipe, "-o", str(tmp / "job.sbatch")]]
    lines += [["plan", recipe, "--hardware", hw] for hw in HARDWARE]
    return lines


ENVIRONMENTS = ({}, {"RECIPEFORGE_TRAIN__LEARNING_RATE": "1e-4"}, {"RECIPEFORGE_HARDWARE__GPUS_PER_NODE": "0"},
                {"RECIPEFORGE_DISTRIBUTED__BACKEND": "ddp"})


# ----------------------------------------------------------------------------- the corpus

def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.yaml"))


@pytest.mark.parametrize("recipe", corpus(), ids=lambda p: p.stem)
def test_plan_with_hardware_works_on_every_user_recipe(recipe, capsys, tmp_path):
    """`plan R --hardware X` answers with a plan for every recipe of the corpus on a machine it fits,
    with and without a `hardware:` section (here one for a CPU-only machine, which the flag replaces)."""
    with_section = tmp_path / f"{recipe.stem}-with-hardware.yaml"
    with_section.write_text(f"extends: {recipe}\nhardware: {{gpus_per_node: 0}}\n")
    for path in (recipe, with_section):
        for hw in ("1xH100-80GB", "8xH100-80GB", "2x8xA100-80GB"):
            argv = ["plan", str(path), "--hardware", hw]
            code, out, err = run(capsys, argv)
            assert code == 0, f"{argv}\n{err}"
            assert out.startswith("Plan: ") and f"on {hw}" in out.splitlines()[0], out[:300]


@pytest.mark.parametrize("recipe", corpus(), ids=lambda p: p.stem)
def test_every_command_and_flag_on_the_corpus(recipe, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories a dry run names stay inside the test
    for argv in command_lines(str(recipe), tmp_path):
        code, _, err = run(capsys, argv)
        assert_answered(code, err, argv)
    for env in ENVIRONMENTS[1:]:
        argv = ["plan", str(recipe), "--hardware", "8xH100-80GB"]
        code, _, err = run(capsys, argv, env, monkeypatch)
        assert_answered(code, err, argv + [str(env)])


def test_hardware_flag_replaces_or_supplies_the_section(capsys, tmp_path):
    """With and without a `hardware:` section, `--hardware` decides the target; two flags that
    disagree are refused at the flag."""
    bare = CORPUS / "minimal-sft.yaml"
    with_section = tmp_path / "with-hardware.yaml"
    with_section.write_text(bare.read_text() + "hardware: {gpus_per_node: 0}\n")
    for recipe in (bare, with_section):
        code, out, err = run(capsys, ["plan", str(recipe), "--hardware", "8xH100-80GB", "--json"])
        assert code == 0, err
        plan = yaml.safe_load(out)
        assert plan["world_size"] == 8 and plan["device"] == "cuda"
    code, out, err = run(capsys, ["plan", str(bare), "--hardware", "8xH100-80GB", "--nnodes", "2", "--json"])
    assert code == 0 and yaml.safe_load(out)["world_size"] == 16, err
    code, _, err = run(capsys, ["plan", str(bare), "--hardware", "2x8xH100-80GB", "--nnodes", "3"])
    assert code == 2 and "--nnodes 3 contradicts --hardware 2x8xH100-80GB" in err
    assert "--hardware 8xH100-80GB --nnodes 3" in err  # the hint says how to write it


def test_nnodes_supplies_the_node_count_a_recipe_leaves_out(capsys, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text((CORPUS / "minimal-sft.yaml").read_text() + "hardware: {gpus_per_node: 8, gpu: H100-80GB}\n")
    code, out, err = run(capsys, ["plan", str(recipe), "--nnodes", "2", "--json"])
    assert code == 0, err
    assert yaml.safe_load(out)["nodes"] == 2


def test_an_empty_section_means_its_defaults(capsys, tmp_path):
    code, _, err = run(capsys, ["resolve", str(CORPUS / "lora-commented-out.yaml")])
    assert code == 0, err
    code, _, err = run(capsys, ["validate", str(CORPUS / "reward-model.yaml"), "train.learning_rate="])
    assert code == 2 and "train.learning_rate" in err  # an empty scalar is still a mistake


# ----------------------------------------------------------------------------- generated shapes

STAGES = {"sft": ("sft-chat.jsonl", "messages"), "pretrain": ("pretrain.jsonl", "text"),
          "dpo": ("preference.jsonl", "preference"), "orpo": ("preference.jsonl", "preference"),
          "cpo": ("preference.jsonl", "preference"), "reward": ("preference.jsonl", "preference"),
          "kto": ("unpaired.jsonl", "unpaired"), "grpo": ("prompts.jsonl", "prompt")}
ABSENT = object()
NULL = None
SECTIONS = {
    "adapter": [ABSENT, NULL, {}, {"type": "lora"}, {"type": "qlora", "r": 8}],
    "train": [ABSENT, NULL, {}, {"max_steps": 3}, {"learning_rate": 1e-4, "global_batch_size": 16}],
    "distributed": [ABSENT, NULL, {}, {"backend": "ddp"}, {"backend": "deepspeed"}, {"backend": "fsdp"},
                    {"backend": "deepspeed", "zero_stage": 3, "offload": "optimizer"}],
    "hardware": [ABSENT, NULL, {}, {"gpus_per_node": 0}, {"gpus_per_node": 8, "gpu": "H100-80GB"},
                 {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB"}, {"gpu": "L4-24GB"}],
    "output": [ABSENT, NULL, {}, {"save_steps": 10}],
    "logging": [ABSENT, NULL, {}, {"tensorboard": True}],
    "kernels": [ABSENT, NULL, []],
    "data_extra": [ABSENT, {"sequence_len": 256}, {"packing": False, "val_size": 0.1}],
}
MODELS = ("tiny:llama", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B")


@st.composite
def recipe_shapes(draw) -> tuple[dict, dict | None]:
    """(recipe, parent or None): a minimal recipe plus optional sections, some moved to a parent."""
    stage = draw(st.sampled_from(sorted(STAGES)))
    data_file, fmt = STAGES[stage]
    recipe: dict = {"stage": stage, "model": {"name_or_path": draw(st.sampled_from(MODELS))},
                    "data": {"datasets": [{"path": str(DATA / data_file), "format": fmt}]}}
    if stage == "grpo":
        recipe["grpo"] = {"rewards": [{"name": "length", "args": {"target": 8}}]}
    for name, choices in SECTIONS.items():
        value = draw(st.sampled_from(choices))
        if value is ABSENT:
            continue
        if name == "data_extra":
            recipe["data"].update(value)
        else:
            recipe[name] = value
    parent = None
    if draw(st.booleans()):
        moved = draw(st.lists(st.sampled_from([k for k in recipe if k != "stage"]), unique=True, max_size=3))
        parent = {k: recipe.pop(k) for k in moved}
    return recipe, parent


def write_shape(tmp: Path, recipe: dict, parent: dict | None, n: int) -> Path:
    path = tmp / f"shape-{n}.yaml"
    if parent is not None:
        (tmp / f"parent-{n}.yaml").write_text(yaml.safe_dump(parent, sort_keys=False))
        recipe = {"extends": f"parent-{n}.yaml", **recipe}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=recipe_shapes(), command=st.integers(min_value=0, max_value=100), env=st.sampled_from(ENVIRONMENTS))
def test_generated_shapes_never_crash_a_command(shape, command, env, capsys, tmp_path_factory, monkeypatch):
    tmp = tmp_path_factory.mktemp("shape")
    monkeypatch.chdir(tmp)
    path = write_shape(tmp, *shape, n=0)
    lines = command_lines(str(path), tmp)
    argv = lines[command % len(lines)]
    code, _, err = run(capsys, argv, env, monkeypatch)
    assert_answered(code, err, argv + [str(env), path.read_text()])


# ----------------------------------------------------------------------------- converted Axolotl configs

def axolotl_configs() -> list[Path]:
    return sorted(AXOLOTL.glob("*.yaml"))


@pytest.mark.parametrize("config", axolotl_configs(), ids=lambda p: p.stem)
def test_converted_axolotl_configs_plan(config, capsys, tmp_path, monkeypatch):
    """The migration path to its end: convert for the 8 GPUs the configs' batch sizes assume, then plan
    on them; converted for one GPU, every command answers (a refusal is a located planner answer)."""
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / f"{config.stem}.yaml"
    code, _, err = run(capsys, ["convert", "axolotl", str(config), "-o", str(recipe), "--world-size", "8"])
    assert code == 0, err
    code, out, err = run(capsys, ["--trust-code", "plan", str(recipe), "--hardware", "8xH100-80GB"])
    assert code == 0, f"{config.name}\n{err}\n{recipe.read_text()}"
    assert out.startswith("Plan: ") and "on 8xH100-80GB" in out.splitlines()[0]
    single = tmp_path / f"{config.stem}-1.yaml"
    code, _, err = run(capsys, ["convert", "axolotl", str(config), "-o", str(single)])
    assert code == 0, err
    for argv in (["--trust-code", "plan", str(single), "--hardware", "1xH100-80GB"],
                 ["--trust-code", "plan", str(single), "--hardware", "8xH100-80GB"],
                 ["--trust-code", "train", str(single), "--dry-run"], ["validate", str(single)]):
        code, _, err = run(capsys, argv)
        assert_answered(code, err, argv)
