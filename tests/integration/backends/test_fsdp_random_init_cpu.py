"""`model.init: random` under FSDP2 (and DeepSpeed ZeRO-3) on two gloo processes: each process makes only
its shards, one module at a time (`components.model_init`, `backends.sharded_loading`), and never holds
the whole model; the weights are the ones one process makes whole (the first loss is the one-process
run's); a LoRA run writes its base to base_model/ only once training has started.

The model is a Llama of hidden size 1024 and 4 layers (about 49M parameters, 186 MiB in fp32), large
enough for each process's memory figures to stand out of the noise of a process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sharded_loading_testing import CONFIG, REPO

pytestmark = pytest.mark.slow

TINY = REPO / "examples" / "yaml" / "tiny"
VARIANT = ("model.init=random", "model.tokenizer=tiny:llama", "train.max_steps=3", "train.micro_batch_size=auto",
           "train.logging_steps=1", "output.save_steps=100", "data.val_size=0", "output.merge_adapter=false",
           "train.learning_rate=1e-4")


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama-1024")
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                  **CONFIG}))
    return path


def _train(tiny, recipe: str, run: Path, config_dir: Path, *extra: str,
           backend: tuple[str, ...] = ("distributed.backend=fsdp",)) -> Path:
    """The variant on two processes (FSDP2 unless `backend` says otherwise), launched from this process
    (`Tiny.launch`: what is checked is what each worker made, not the command line)."""
    return tiny.launch(recipe, run, f"model.name_or_path={config_dir}", *VARIANT, *backend, *extra)


def _records(run: Path) -> list[dict]:
    return [json.loads((run / "sharded_loading" / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_made_half(seen: dict, full_bytes: int) -> None:
    """One process made half of every tensor, never held more than its part and one module's tensors,
    and grew by far less than the model (measured: resident memory, `released_rss_bytes`)."""
    assert seen["source"] == "random init"
    full, local = seen["full_base_bytes"], seen["local_base_bytes"]
    assert full == full_bytes
    assert abs(2 * local - full) < 0.01 * full
    assert seen["peak_live_base_bytes"] <= local + 3 * seen["largest_tensor_bytes"], seen
    assert seen["peak_live_base_bytes"] < 0.75 * full, seen
    # Measured (resident memory, `released_rss_bytes`): the skeleton took no weights (what it grew is the
    # model code's first import, ~30 MiB under DeepSpeed), and making the shards grew the process by
    # about its half, never by the whole model.
    assert seen["skeleton_rss_growth_bytes"] < 0.25 * full, seen
    assert seen["fill_rss_peak_growth_bytes"] < 0.75 * full, seen
    assert seen["fill_rss_held_growth_bytes"] < 0.65 * full, seen


def _full_bytes(dtype_bytes: int) -> int:
    c = CONFIG
    kv = c["hidden_size"] // c["num_attention_heads"] * c["num_key_value_heads"]
    layer = (2 * c["hidden_size"] ** 2 + 2 * c["hidden_size"] * kv + 3 * c["hidden_size"] * c["intermediate_size"]
             + 2 * c["hidden_size"])
    return dtype_bytes * (c["num_hidden_layers"] * layer + 2 * c["vocab_size"] * c["hidden_size"] + c["hidden_size"])


@pytest.fixture(scope="module")
def runs(tiny, config_dir, tmp_path_factory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("fsdp-random")
    single = tiny.train(str(TINY / "sft-full.yaml"), work / "single", f"model.name_or_path={config_dir}", *VARIANT)
    sharded = work / "fsdp"
    _train(tiny, "sft-full", sharded, config_dir)
    return single, sharded


def test_each_process_makes_only_its_shards(runs):
    _, sharded = runs
    for seen in _records(sharded):
        _assert_made_half(seen, _full_bytes(4))
    observed = json.loads((sharded / "backend.json").read_text())["observed"]
    assert observed["dtensor_params"] == observed["params"] and observed["local_param_elements"] * 2 == \
        observed["full_param_elements"]
    assert not (sharded / "base_model").exists()  # a full fine-tune needs no base


def test_the_shards_are_the_weights_one_process_makes(tiny, runs):
    single, sharded = runs
    mine, ref = tiny.values(sharded, "loss"), tiny.values(single, "loss")
    assert len(mine) == 3 and mine[0] == pytest.approx(ref[0], abs=1e-4), (mine, ref)
    assert mine == pytest.approx(ref, abs=2e-3), (mine, ref)


def test_a_lora_run_writes_its_base_after_training_started(tiny, config_dir, tmp_path):
    from safetensors import safe_open

    run = tmp_path / "lora"
    _train(tiny, "sft-lora", run, config_dir)
    copy = 4 * CONFIG["vocab_size"] * CONFIG["hidden_size"]  # modules_to_save: lm_head, made like the base's
    for seen in _records(run):
        _assert_made_half(seen, _full_bytes(4) + copy)
    first_step = next(r["time"] for r in tiny.records(run, "train") if r.get("step") == 1)
    base = run / "base_model"
    assert (base / "config.json").stat().st_mtime > first_step
    with safe_open(str(base / "model.safetensors"), "pt") as fh:
        assert tuple(fh.get_slice("model.layers.0.mlp.up_proj.weight").get_shape()) == \
            (CONFIG["intermediate_size"], CONFIG["hidden_size"])
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    assert Path(adapter["base_model_name_or_path"]) == base.resolve()


def test_zero3_makes_only_its_partitions(tiny, runs, config_dir, tmp_path):
    """The same under DeepSpeed ZeRO-3: each tensor, made whole once, is handed to DeepSpeed's own
    partitioning, which keeps this process's slice; the first loss is again the one-process run's."""
    single, _ = runs
    run = tmp_path / "zero3"
    _train(tiny, "sft-full", run, config_dir, backend=("distributed.backend=deepspeed", "distributed.zero_stage=3"))
    for seen in _records(run):
        _assert_made_half(seen, _full_bytes(4))
    observed = json.loads((run / "backend.json").read_text())["observed"]
    assert observed["zero_stage"] == 3 and observed["partitioned_params"] > 0
    assert observed["local_param_elements"] * 2 <= observed["full_param_elements"] + 2 * 4096
    mine, ref = tiny.values(run, "loss"), tiny.values(single, "loss")
    assert mine[0] == pytest.approx(ref[0], abs=1e-4), (mine, ref)
