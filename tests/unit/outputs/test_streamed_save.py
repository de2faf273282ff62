"""final/ written tensor by tensor (`outputs.streamed_save`) is the folder `save_pretrained` writes from
the whole state dict: the same files, byte for byte, the same index and config, for one file and for
several, with tied weights, renamed checkpoint keys (LLaVA) and modules kept in fp32; a model whose
checkpoint layout combines tensors (fused MoE experts) is handed back to the gathered save. The
gathers of DTensor shards across processes run in tests/integration/backends/test_fsdp_cpu.py."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _model(arch: str):
    from recipeforge.components.tiny_spec import TINY_CONFIGS

    kwargs = dict(TINY_CONFIGS[arch])
    config = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    auto = transformers.AutoModelForImageTextToText if arch == "llava" else transformers.AutoModelForCausalLM
    return auto.from_config(config).float()


def _folder(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llava"])   # plain, tied embeddings, renamed keys
@pytest.mark.parametrize("size", [100_000, 10**9])               # several files, one file
def test_the_streamed_folder_is_byte_equal_to_save_pretrained(tmp_path, arch, size):
    from recipeforge.outputs.streamed_save import INDEX_NAME, dtensor_weights, save_streamed
    from recipeforge.outputs.weights import save_pretrained_atomic

    model = _model(arch)
    streamed = save_streamed(model, dtensor_weights(model), None, tmp_path / "streamed", is_main=True,
                             dtype=torch.bfloat16, max_shard_size=size)
    assert streamed is not None
    gathered = save_pretrained_atomic(model, None, tmp_path / "gathered", dtype=torch.bfloat16, max_shard_size=size)
    mine, theirs = _folder(streamed), _folder(gathered)
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert mine[name] == theirs[name], name
    weights = sorted(n for n in mine if n.endswith(".safetensors"))
    if size < 10**9:
        assert len(weights) > 2 and weights[0] == f"model-00001-of-{len(weights):05d}.safetensors"
        index = json.loads(mine[INDEX_NAME])
        assert set(index["weight_map"].values()) == set(weights)
    else:
        assert weights == ["model.safetensors"] and INDEX_NAME not in mine
    loaded = type(model).from_pretrained(streamed)
    assert loaded.dtype == torch.bfloat16
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[key].to(torch.bfloat16)), key


def test_modules_kept_in_fp32_are_written_in_fp32(tmp_path):
    from safetensors import safe_open

    from recipeforge.outputs.streamed_save import dtensor_weights, save_streamed

    model = _model("llama")
    model._keep_in_fp32_modules = ["norm"]
    out = save_streamed(model, dtensor_weights(model), None, tmp_path / "final", is_main=True, dtype=torch.bfloat16,
                        max_shard_size=10**9)
    assert out is not None
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.float32
        assert f.get_tensor("model.layers.0.mlp.up_proj.weight").dtype == torch.bfloat16
        assert f.metadata() == {"format": "pt"}


def test_a_layout_of_combined_tensors_is_left_to_the_gathered_save(tmp_path):
    from recipeforge.outputs.streamed_save import dtensor_weights, save_streamed

    model = _model("qwen3_moe")  # fused 3-D experts, written back as one tensor per expert
    assert save_streamed(model, dtensor_weights(model), None, tmp_path / "final", is_main=True, dtype=None,
                         max_shard_size=10**9) is None
    assert not (tmp_path / "final").exists()
