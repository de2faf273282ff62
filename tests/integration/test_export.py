"""`recipeforge export RUN_DIR --format FMT` as a user types it: a tiny LoRA run (merged first) and a tiny
full run exported to merged safetensors, torchao int8/int4 and (where llmcompressor is installed)
compressed-tensors, each loaded back by transformers and self-checked against the unquantized model; and
every refusal (exit 2, nothing written or replaced)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.outputs.ownership import OWNER_FILE
from recipeforge.tools.exporters.formats import FORMAT_SPECS, ExportFormat, Family

pytestmark = pytest.mark.slow


def _installed(package: str | None) -> bool:
    import importlib.util

    return package is None or importlib.util.find_spec(package) is not None


# llmcompressor is not in the dev extra (it pins an older transformers): its formats run where it is installed.
WRITTEN = [pytest.param(f, marks=pytest.mark.skipif(not _installed(spec.package),
                                                    reason=f"{spec.package} is not installed"), id=str(f))
           for f, spec in FORMAT_SPECS.items() if spec.elsewhere is None]


def export(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`recipeforge export ...` in a fresh process, as typed."""
    return subprocess.run([sys.executable, "-m", "recipeforge", "export", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def lora_run(tiny, tmp_path_factory) -> Path:
    chat = Path(tiny.recipes).parent.parent / "data" / "sft-chat.jsonl"
    # Evaluation rows: the self-check measures perplexity on them instead of the fixed prompts.
    return tiny.train("sft-lora", tmp_path_factory.mktemp("lora") / "run", "train.max_steps=4",
                      f"data.eval_datasets=[{{path: {chat}, format: messages}}]", "output.merge_adapter=false")


@pytest.fixture(scope="module")
def full_run(tiny, tmp_path_factory) -> Path:
    return tiny.train("sft-full", tmp_path_factory.mktemp("full") / "run", "train.max_steps=4")


def _load_back(out: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(out), dtype="auto").eval(), AutoTokenizer.from_pretrained(str(out))


@pytest.mark.parametrize("fmt", WRITTEN)
def test_a_lora_run_exports_loads_back_and_passes_its_self_check(lora_run, fmt):
    done = export(str(lora_run), "--format", str(fmt), cwd=lora_run.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    out = lora_run / f"export-{fmt}"
    assert f"written to {out}" in done.stdout and "self-check passed" in done.stdout, done.stdout
    record = json.loads((out / "export.json").read_text())
    check = record["self_check"]
    assert check["passed"] and abs(check["perplexity_change"]) <= FORMAT_SPECS[fmt].max_ppl_change
    assert check["texts_from"] == "4 rows of sft-chat.jsonl"
    readme = (out / "README.md").read_text()
    assert f"vllm serve {out}" in readme and "AutoModelForCausalLM.from_pretrained" in readme
    assert "convert_hf_to_gguf.py" in readme and "passed" in readme
    # No merged/ and nothing hidden left behind (a staging folder) besides the run's ownership marker.
    assert not (lora_run / "merged").exists()
    assert [p.name for p in lora_run.iterdir() if p.name.startswith(".")] == [OWNER_FILE]

    import torch

    model, tokenizer = _load_back(out)
    layer = model.model.layers[0].mlp.down_proj
    config = json.loads((out / "config.json").read_text())
    family = FORMAT_SPECS[fmt].family
    if family == Family.SAFETENSORS:
        assert "quantization_config" not in config and type(layer.weight) is torch.nn.Parameter
    elif family == Family.TORCHAO:
        assert config["quantization_config"]["quant_method"] == "torchao"
        expected = {ExportFormat.TORCHAO_INT8: "Int8Tensor", ExportFormat.TORCHAO_INT4: "IntxUnpackedToInt8Tensor",
                    ExportFormat.TORCHAO_INT8_INT4: "IntxUnpackedToInt8Tensor"}
        assert type(layer.weight).__name__ == expected[fmt]
        # int8-int4 also quantizes each layer's input at run time; int4 weight-only does not
        quantizes_inputs = getattr(layer.weight, "activation_quantization", None) is not None
        assert quantizes_inputs == (fmt == ExportFormat.TORCHAO_INT8_INT4), vars(layer.weight).keys()
    else:  # packed int4 stays packed in the loaded model (weight_packed); int8 and fp8 load as weights
        assert hasattr(layer, "weight_packed" if fmt == ExportFormat.W4A16 else "weight")
        quant = config["quantization_config"]
        assert quant["quant_method"] == "compressed-tensors" and "lm_head" in quant["ignore"]
        assert quant["format"] == {"w8a8": "int-quantized", "w4a16": "pack-quantized", "fp8": "float-quantized"}[fmt]
    ids = tokenizer("What does the cow say?", return_tensors="pt").input_ids
    with torch.no_grad():
        out_ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out_ids.shape[1] == ids.shape[1] + 4


def test_a_full_run_exports_to_safetensors_as_saved_and_int8(full_run):
    done = export(str(full_run), "--format", "safetensors", "-o", "shipped", cwd=full_run.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    out = full_run.parent / "shipped"
    assert (out / "model.safetensors").read_bytes() == (full_run / "final" / "model.safetensors").read_bytes()
    assert json.loads((out / "export.json").read_text())["self_check"]["perplexity_change"] == 0.0

    done = export(str(full_run), "--format", "torchao-int8", "--no-check", cwd=full_run.parent)
    assert done.returncode == 0 and "self-check" not in done.stdout, done.stderr[-3000:]
    record = json.loads((full_run / "export-torchao-int8" / "export.json").read_text())
    assert record["self_check"] is None and record["settings"]["weights"] == "int8"
    assert _load_back(full_run / "export-torchao-int8")[0] is not None


def _refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stderr.startswith("error: ")
    for word in words:
        assert word in done.stderr, done.stderr


def test_bad_input_is_refused_and_nothing_is_lost(full_run, tmp_path):
    _refused(export(str(tmp_path), "--format", "safetensors", cwd=tmp_path), "has no final/ model")
    _refused(export(str(full_run), "--format", "torchao_int4", cwd=tmp_path), "unknown export format",
             "did you mean 'torchao-int4'?")
    _refused(export(str(full_run), "--format", "gguf", cwd=tmp_path), "convert_hf_to_gguf.py",
             f"{full_run}/export-safetensors --outtype f16")
    _refused(export(str(full_run), "--format", "safetensors", "-o", str(full_run / "final"), "--overwrite",
                    cwd=tmp_path), "would replace")
    _refused(export(str(full_run), "--format", "safetensors", "-o", str(full_run.parent), "--overwrite",
                    cwd=tmp_path), "is a parent of the run directory being exported")

    # A folder of someone else's files: refused, with --overwrite too (it replaces only what recipeforge wrote).
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    _refused(export(str(full_run), "--format", "safetensors", "-o", str(taken), cwd=tmp_path), "--overwrite")
    _refused(export(str(full_run), "--format", "safetensors", "-o", str(taken), "--overwrite", cwd=tmp_path),
             "entries recipeforge did not write")
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"]
    # An earlier export: replaced with --overwrite.
    shipped = tmp_path / "shipped"
    for flags in ([], ["--overwrite"]):
        done = export(str(full_run), "--format", "safetensors", "-o", str(shipped), "--no-check", *flags, cwd=tmp_path)
        assert done.returncode == 0 and (shipped / "model.safetensors").is_file(), done.stderr[-2000:]


@pytest.mark.parametrize(("fmt", "package", "install"), [
    ("torchao-int4", "torchao", "pip install 'recipeforge[torchao]'"),
    ("w4a16", "llmcompressor", "pip install 'recipeforge[llmcompressor]'")])
def test_a_missing_package_is_refused_with_the_install_line(full_run, tmp_path, fmt, package, install):
    # The package hidden from this one process, as when it is not installed (find_spec answers None).
    code = (f"import sys; sys.modules[{package!r}] = None; from recipeforge.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "export", str(full_run), "--format", fmt],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    _refused(done, f"needs the {package} package", install)
    assert not (full_run / f"export-{fmt}").exists()
