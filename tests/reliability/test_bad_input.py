"""Bad input anywhere gets a located, hinted error with exit code 2 and no traceback.

Each case writes a few files into an empty folder, runs one command there, and asserts the exact
location (``file:line:col`` or the pseudo-source) and the message.
"""

from __future__ import annotations

import pytest

from hostile_testing import OK, ROWS
from recipeforge.cli import main

GRPO = OK.replace("sft", "grpo").replace("alpaca", "prompt")
LIMITED = OK.split("data:")[0] + "data:\n  sequence_len: 16\n"   # shorter than any rendered row
DATASETS = "  datasets:\n    - {path: rows.jsonl, format: alpaca}\n"
# A complete config of a model type this transformers does not know.
UNKNOWN_ARCH = ('{"model_type": "nonsense_arch", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, '
                '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}')


def case(id, recipe=None, args=("validate", "r.yaml"), where="", message="", files=None, hint=""):
    """A recipe (r.yaml), extra files, the command line, and what stderr must say."""
    return pytest.param({"r.yaml": recipe, **(files or {})}, list(args), where, message, hint, id=id)


CASES = [
    # -- recipe syntax and safety
    case("yaml-syntax", OK + "train: [1, 2\n", where="r.yaml:9:1", message="YAML syntax error"),
    case("python-tag", OK + "name: !!python/object/apply:os.system [ls]\n", where="r.yaml:8:7",
         message="refusing Python tag"),
    case("custom-tag", OK + "name: !env HOME\n", where="r.yaml:8:7", message="unsupported YAML tag"),
    case("duplicate-key", OK + "stage: dpo\n", where="r.yaml:8:1", message="duplicate key 'stage'"),
    case("alias-bomb", "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef")),
        where="r.yaml", message="more than 20000 nodes"),
    case("not-a-mapping", "- stage\n- sft\n", where="r.yaml:1:1", message="must be a mapping"),
    case("non-string-key", OK + "1: x\n", where="r.yaml:8:1", message="keys must be plain strings"),
    case("empty-file", "", where="r.yaml:1:1", message="required key 'stage' is missing"),
    case("recipe-missing", None, args=("validate", "nope.yaml"), message="recipe file not found: nope.yaml"),
    case("recipe-is-dir", None, args=("validate", "."), message="is a directory"),
    case("not-utf8", None, args=("validate", "latin.yaml"), files={"latin.yaml": b"name: caf\xe9\n"},
         message="not UTF-8"),
    # -- keys, types, ranges
    case("typo-key", OK + "adapter:\n  tpye: lora\n", where="r.yaml:9:3", message="unknown key 'tpye'",
         hint="did you mean 'type'?"),
    case("typo-section", OK + "trian: {seed: 1}\n", where="r.yaml:8:1", message="unknown key 'trian'",
         hint="did you mean 'train'?"),
    case("wrong-type", OK + "train:\n  seed: many\n", where="r.yaml:9:3", message="expected an integer (got 'many')"),
    case("out-of-range", OK + "adapter:\n  r: 0\n", where="r.yaml:9:3", message="must be > 0 (got 0)"),
    case("bad-enum", OK + "model2: 1\n", where="r.yaml:8:1", message="unknown key 'model2'"),
    case("bad-format", OK.replace("alpaca", "alpacca"), where="r.yaml:7:26", message="must be one of",
         hint="did you mean 'alpaca'?"),
    case("bad-stage", OK.replace("stage: sft", "stage: stf"), where="r.yaml:1:1", message="must be one of",
         hint="did you mean 'sft'?"),
    case("missing-model", "stage: sft\ndata:\n  datasets: [{path: a, format: text}]\n", where="r.yaml:1:1",
         message="required key 'model' is missing"),
    case("empty-datasets", OK.replace("    - {path: rows.jsonl, format: alpaca}\n", "    []\n")
         .replace("datasets:\n", "datasets:"), where="r.yaml:6:3", message="at least 1 item"),
    case("union-type", OK + "train: {micro_batch_size: lots}\n", where="r.yaml:8:9",
         message="expected auto or an integer"),
    # -- cross-field rules
    case("qlora-fp32", OK + "adapter: {type: qlora}\n", args=("validate", "r.yaml", "model.dtype=fp32"),
         where="<cli model.dtype=fp32>", message="QLoRA computes in bf16 or fp16"),
    case("dpo-format", OK.replace("sft", "dpo"), where="r.yaml:7:26", message="stage 'dpo' cannot train on format"),
    case("grpo-no-grpo", GRPO, where="r.yaml:1:1", message="required key 'grpo' is missing"),
    case("grpo-no-rewards", GRPO + "grpo: {rewards: []}\n", where="r.yaml:8:8", message="no reward function"),
    case("grpo-unknown-environment", GRPO + "grpo: {environment: {name: calculater}}\n", where="r.yaml:8:22",
         message="unknown environment 'calculater'", hint="calculator"),
    case("grpo-environment-code", GRPO + "grpo: {environment: {name: 'my_envs:Game'}}\n", where="r.yaml:8:22",
         message="environment 'my_envs:Game' is Python code", hint="allow_code: true"),
    case("grpo-divisible", GRPO + "grpo: {num_generations: 3, rewards: [{name: length}]}\n"
         "train: {global_batch_size: 8}\n", where="r.yaml:9:9", message="divisible by grpo.num_generations"),
    case("rloo-divisible", OK.replace("sft", "rloo").replace("alpaca", "prompt") + "rloo: {num_generations: 3, "
         "rewards: [{name: length}]}\ntrain: {global_batch_size: 8}\n", where="r.yaml:9:9",
         message="divisible by rloo.num_generations"),
    case("merge-no-adapter", OK + "output: {merge_adapter: true}\n", where="r.yaml:8:10",
         message="no adapter to merge"),
    case("zero-with-ddp", OK + "distributed: {backend: ddp, zero_stage: 2}\n", where="r.yaml:8:29",
         message="applies to DeepSpeed"),
    case("offload-single", OK + "distributed: {backend: single, offload: optimizer}\n", where="r.yaml:8:32",
         message="cannot offload"),
    case("tp-with-deepspeed", OK + "distributed: {backend: deepspeed, tensor_parallel: 2}\n", where="r.yaml:8:35",
         message="needs the fsdp or megatron backend"),
    case("micro-gt-global", OK + "train: {global_batch_size: 4, micro_batch_size: 8}\n", where="r.yaml:8:31",
         message="larger than the global batch"),
    case("best-without-eval", OK + "train: {load_best_model_at_end: true}\n", where="r.yaml:8:9",
         message="needs evaluation data"),
    case("unknown-kernel", OK + "kernels: [ligre]\n", where="r.yaml:8:1", message="unknown kernel 'ligre'",
         hint="did you mean 'liger'?"),
    case("val-size-share", OK + "", args=("validate", "r.yaml", "data.val_size=1.5"),
         where="<cli data.val_size=1.5>", message="a share must be below 1"),
    # -- composition, interpolation, overrides
    case("extends-missing", "extends: base.yaml\n" + OK, where="r.yaml:1:1", message="extended recipe not found"),
    case("extends-cycle", "extends: a.yaml\n", files={"a.yaml": "extends: r.yaml\n"}, where="a.yaml:1:1",
         message="extends cycle: r.yaml -> a.yaml -> r.yaml"),
    case("error-in-parent", "extends: base.yaml\n", files={"base.yaml": OK + "train: {seed: -1}\n"},
         where="base.yaml:8:9", message="must be >= 0"),
    case("required-value", OK + "output:\n  dir: ???\n", where="r.yaml:9:3", message="required value is missing"),
    case("bad-reference", OK + "name: ${train.nope}\n", where="r.yaml:8:1", message="cannot resolve"),
    case("malformed-interpolation", OK + "name: 'x ${'\n", where="r.yaml:8:1", message="bad interpolation syntax"),
    case("env-unset", OK + "name: ${env:RF_SURELY_UNSET_VAR}\n", where="r.yaml:8:1",
         message="RF_SURELY_UNSET_VAR is not set"),
    case("override-no-equals", OK, args=("validate", "r.yaml", "train.seed"), where="<cli train.seed>",
         message="is not key=value"),
    case("override-bad-index", OK, args=("validate", "r.yaml", "data.datasets.3.path=x"),
         where="<cli data.datasets.3.path=x>", message="out of range"),
    case("override-delete-missing", OK, args=("validate", "r.yaml", "~adapter.r"), where="<cli ~adapter.r>",
         message="the recipe does not set it"),
    case("override-bad-yaml", OK, args=("validate", "r.yaml", "train.seed=[1"), where="<cli train.seed=[1>",
         message="cannot parse the value"),
    # -- hardware, models, planning
    case("unknown-gpu", OK, args=("plan", "r.yaml", "--hardware", "8xH1OO-80GB"), message="H1OO",
         hint="H100-80GB"),
    case("malformed-hardware", OK, args=("plan", "r.yaml", "--hardware", "lots-of-gpus"), message="hardware"),
    case("recipe-unknown-gpu", OK.replace("{gpus_per_node: 0}", "{gpus_per_node: 8, gpu: A99}"),
         args=("plan", "r.yaml"), where="r.yaml:4:30", message="unknown accelerator 'A99'"),
    case("unknown-tiny-model", OK.replace("tiny:llama", "tiny:gpt9"), args=("plan", "r.yaml"), where="r.yaml:3:3",
         message="unknown tiny model 'tiny:gpt9'"),
    case("missing-local-model", OK.replace("tiny:llama", "./no/such/model"), args=("plan", "r.yaml"),
         where="r.yaml:3:3", message="cannot size model './no/such/model'"),
    case("does-not-fit", OK.replace("tiny:llama", "meta-llama/Llama-3.1-70B"),
         args=("plan", "r.yaml", "--hardware", "1xL4-24GB"), where="r.yaml:3:3", message="does not fit",
         hint="adapter.type: qlora"),
    # -- data files
    case("data-missing", OK.replace("rows.jsonl", "nope.jsonl"), args=("preprocess", "r.yaml"), where="r.yaml:7:8",
         message="data file 'nope.jsonl' not found"),
    case("data-bad-row", OK, args=("preprocess", "r.yaml"), files={"rows.jsonl": ROWS + '{"instruction": "x"\n'},
         where="r.yaml:7:8", message="row 5 is not valid JSON (Expecting ',' delimiter at column 20)"),
    case("data-not-object", OK, args=("preprocess", "r.yaml"), files={"rows.jsonl": ROWS + "[1, 2]\n"},
         where="r.yaml:7:8", message="row 5 is a JSON list"),
    case("data-missing-column", OK, args=("preprocess", "r.yaml"), files={"rows.jsonl": '{"q": "a", "output": "b"}\n'},
         where="r.yaml:7:26", message="needs column 'instruction'", hint="columns: {instruction: <your column>}"),
    case("data-empty", OK, args=("preprocess", "r.yaml"), files={"rows.jsonl": "\n"}, where="r.yaml:7:8",
         message="has no rows"),
    case("data-unsupported", OK.replace("rows.jsonl", "rows.xlsx"), args=("preprocess", "r.yaml"),
         files={"rows.xlsx": "x"}, where="r.yaml:7:8", message="unsupported data file type '.xlsx'"),
    case("data-all-too-long", LIMITED + "  truncation: drop\n" + DATASETS, args=("preprocess", "r.yaml"),
         where="r.yaml:9:8", message="all 4 rows were dropped: 4 longer than data.sequence_len (16 tokens) with "
                                     "data.truncation: drop", hint="set data.truncation: truncate"),
    case("data-no-target-left", LIMITED + DATASETS, args=("preprocess", "r.yaml"), where="r.yaml:8:8",
         message="all 4 rows were dropped: 4 with no target tokens left to train on",
         hint="raise data.sequence_len or check that the response column is filled"),
    case("model-unknown-architecture", OK.replace("tiny:llama", "./m\n  tokenizer: tiny:llama")
         + "train: {global_batch_size: 4}\n",
         args=("train", "r.yaml"), files={"m/config.json": UNKNOWN_ARCH}, where="r.yaml:3:3",
         message="does not recognize this architecture", hint="upgrade transformers"),
    # -- plugin names
    case("unknown-rollout-engine", GRPO + "grpo: {rewards: [{name: length}], rollout: {engine: vlm}}\n",
         where="r.yaml:8:45", message="unknown rollout engine 'vlm'", hint="did you mean 'vllm'?"),
    case("unknown-reward", GRPO + "grpo: {rewards: [{name: lenght}]}\n", where="r.yaml:8:19",
         message="unknown reward 'lenght'", hint="did you mean 'length'?"),
    case("unknown-backend", OK, args=("validate", "r.yaml", "distributed.backend=megatorn"),
         where="<cli distributed.backend=megatorn>", message="unknown backend 'megatorn'", hint="did you mean 'megatron'?"),
    # -- command-line arguments and run directories
    case("resume-not-a-checkpoint", OK + "output: {resume: /nope}\n", args=("train", "r.yaml"), where="r.yaml:8:10",
         message="cannot resume from '/nope': not a complete checkpoint directory"),
    case("nproc-zero", OK, args=("train", "r.yaml", "--nproc-per-node", "0"),
         message="--nproc-per-node must be >= 1 (got 0)"),
    case("hardware-no-gpus", OK, args=("plan", "r.yaml", "--hardware", "0xH100-80GB"), where="--hardware:",
         message="needs at least one node and one GPU"),
    case("merge-unfinished", None, args=("merge", "."), message="has no final/ model",
         hint="train the recipe first"),
]


@pytest.mark.parametrize("files, args, where, message, hint", CASES)
def test_bad_input(tmp_path, monkeypatch, capsys, files, args, where, message, hint):
    files = {"rows.jsonl": ROWS, **files}
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # Commands that got as far as training log progress first; the error is the last thing said.
    start = err.find("error: ")
    assert start == 0 or (start > 0 and err[start - 1] == "\n"), err
    err = err[start:]
    if where:
        lines = err.removeprefix("error: ").splitlines()
        assert any(line.startswith(where) for line in lines), err
    assert message in err, err
    assert hint in err, err


def test_at_least_forty_cases():
    assert len(CASES) >= 40
