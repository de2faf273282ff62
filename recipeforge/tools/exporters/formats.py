"""The formats `recipeforge export` knows, named once, with what each needs and how closely its
self-check must match the unquantized model.

A format recipeforge does not write itself (no maintained converter installs from pip next to this
torch and transformers) is still named here: asking for it answers with the exact command to run.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipeforge.errors import RecipeError, did_you_mean
from recipeforge.stage_specs import Names


class ExportFormat(Names):
    """What `recipeforge export --format` writes."""

    SAFETENSORS = "safetensors"          # full precision; a LoRA run merged into its base
    TORCHAO_INT8 = "torchao-int8"        # torchao int8 weight-only, per channel
    TORCHAO_INT4 = "torchao-int4"        # torchao int4 weight-only, per group of input features
    TORCHAO_INT8_INT4 = "torchao-int8-int4"  # torchao int4 weights per group, int8 activations per token
    GGUF = "gguf"                        # llama.cpp, 16-bit
    GGUF_Q8_0 = "gguf-q8_0"              # llama.cpp, 8-bit blocks
    W8A8 = "w8a8"                        # compressed-tensors (vLLM), int8 weights and activations
    W4A16 = "w4a16"                      # compressed-tensors (vLLM), int4 weights
    FP8 = "fp8"                          # compressed-tensors (vLLM), fp8 weights, dynamic fp8 activations


class Family(Names):
    """Who writes a format: the module that handles it."""

    SAFETENSORS = "safetensors"
    TORCHAO = "torchao"
    GGUF = "gguf"
    COMPRESSED_TENSORS = "compressed-tensors"


# llama.cpp's converter is a script in its repository, not in the `gguf` wheel (which only reads and
# writes the container): recipeforge hands over a merged safetensors folder and the command.
_LLAMA_CPP = ("run `recipeforge export {run_dir} --format safetensors`, then in a clone of github.com/ggml-org/llama.cpp "
              "`python convert_hf_to_gguf.py {run_dir}/export-safetensors --outtype {outtype} --outfile "
              "model-{outtype}.gguf` (its pip requirements: requirements/requirements-convert_hf_to_gguf.txt)")
_WHY = {Family.GGUF: "llama.cpp's converter is not on PyPI (the gguf wheel only reads and writes the container)"}
# llmcompressor 0.14 pins transformers<=5.17, older than the newest transformers recipeforge supports: the
# dev environment does not hold it (it would downgrade the training stack of every test); a user installs
# it with the extra, best in an environment of its own.
_LLMCOMPRESSOR = ("pip install 'recipeforge[llmcompressor]', best in a virtual environment of its own "
                  "(llmcompressor pins transformers<=5.17 and installs it)")


@dataclass(frozen=True)
class FormatSpec:
    """One export format: what it is, who writes it, and what its self-check accepts."""

    name: ExportFormat
    family: Family
    summary: str
    max_ppl_change: float        # the largest relative perplexity change against the unquantized model
    package: str | None = None   # the import the format needs, when it needs one
    install: str | None = None   # how to install that package
    elsewhere: str | None = None  # set when recipeforge does not write it: what to run ({run_dir} filled in)

    def __str__(self) -> str:
        return self.name.value


FORMAT_SPECS: dict[ExportFormat, FormatSpec] = {spec.name: spec for spec in (
    FormatSpec(ExportFormat.SAFETENSORS, Family.SAFETENSORS,
               "full-precision safetensors (a LoRA adapter merged into its base)", 1e-4),
    # int8 per channel barely moves a model; int4 per group of 32-128 costs a few percent of perplexity.
    FormatSpec(ExportFormat.TORCHAO_INT8, Family.TORCHAO,
               "torchao int8 weight-only (transformers TorchAoConfig; vLLM, SGLang)", 0.02,
               package="torchao", install="pip install 'recipeforge[torchao]'"),
    FormatSpec(ExportFormat.TORCHAO_INT4, Family.TORCHAO,
               "torchao int4 weight-only, grouped (transformers TorchAoConfig; vLLM)", 0.10,
               package="torchao", install="pip install 'recipeforge[torchao]'"),
    # int8 activations per token on top of int4 weights: a little more than int4 weight-only
    FormatSpec(ExportFormat.TORCHAO_INT8_INT4, Family.TORCHAO,
               "torchao int4 weights per group, dynamic int8 activations per token (transformers TorchAoConfig; "
               "ExecuTorch, CPU)", 0.12, package="torchao", install="pip install 'recipeforge[torchao]'"),
    FormatSpec(ExportFormat.GGUF, Family.GGUF, "llama.cpp GGUF, 16-bit", 1e-3,
               elsewhere=_LLAMA_CPP.replace("{outtype}", "f16")),
    FormatSpec(ExportFormat.GGUF_Q8_0, Family.GGUF, "llama.cpp GGUF, q8_0", 0.02,
               elsewhere=_LLAMA_CPP.replace("{outtype}", "q8_0")),
    # compressed-tensors through llmcompressor, data-free: W8A8's activations are quantized per token at
    # run time (no calibration), W4A16 groups weights like torchao-int4, FP8 scales per channel.
    FormatSpec(ExportFormat.W8A8, Family.COMPRESSED_TENSORS,
               "compressed-tensors W8A8: int8 weights, dynamic int8 activations (vLLM)", 0.02,
               package="llmcompressor", install=_LLMCOMPRESSOR),
    FormatSpec(ExportFormat.W4A16, Family.COMPRESSED_TENSORS, "compressed-tensors W4A16: int4 weights (vLLM)", 0.10,
               package="llmcompressor", install=_LLMCOMPRESSOR),
    FormatSpec(ExportFormat.FP8, Family.COMPRESSED_TENSORS,
               "compressed-tensors FP8: fp8 weights, dynamic fp8 activations (vLLM)", 0.05,
               package="llmcompressor", install=_LLMCOMPRESSOR),
)}

FORMATS = tuple(f.value for f in ExportFormat)
# The formats that quantize weights to int4 in groups: a quantization-aware run's groups apply to them.
GROUPED_INT4 = (ExportFormat.TORCHAO_INT4, ExportFormat.TORCHAO_INT8_INT4)

# int4 groups: the largest of these that divides every quantized layer's input width. 128 is torchao's
# default and what serving engines expect of real models; tiny test models need smaller groups.
_INT4_GROUPS = (128, 64, 32)


def int4_group(model_config: dict) -> int:
    """The int4 group size for a model with `model_config` (its config.json): the largest of
    `_INT4_GROUPS` dividing the input width of every linear layer."""
    widths = [model_config.get("hidden_size"), model_config.get("intermediate_size"),
              (model_config.get("head_dim") or 0) * (model_config.get("num_attention_heads") or 0)]
    widths = [w for w in widths if w]
    return next((g for g in _INT4_GROUPS if all(w % g == 0 for w in widths)), _INT4_GROUPS[-1])


def format_spec(name: str) -> FormatSpec:
    """The spec of the format called `name`; an unknown name is a `RecipeError` naming the known ones."""
    try:
        return FORMAT_SPECS[ExportFormat(name)]
    except ValueError:
        close = did_you_mean(name, FORMATS)
        raise RecipeError(f"unknown export format {name!r}", key="--format",
                          hint=(f"{close} " if close else "") + f"formats: {', '.join(FORMATS)}") from None


def _fill_run_dir(command: str, run_dir: str) -> str:
    """`command` with the run's paths in it, shell-quoted (a folder name with a space or a quote)."""
    import shlex

    return command.replace("{run_dir}/export-safetensors", shlex.quote(f"{run_dir}/export-safetensors")) \
        .replace("{run_dir}", shlex.quote(run_dir))


def check_available(spec: FormatSpec, run_dir: str = "RUN_DIR") -> None:
    """Refuse (a `RecipeError`) a format recipeforge does not write, or whose package is missing,
    with what to run or install instead (for the run in `run_dir`)."""
    if spec.elsewhere:
        raise RecipeError(f"recipeforge does not write {spec.name} itself: {_WHY[spec.family]}", key="--format",
                          hint=_fill_run_dir(spec.elsewhere, str(run_dir)))
    if spec.package:
        import importlib.util

        if importlib.util.find_spec(spec.package) is None:
            raise RecipeError(f"{spec.name} needs the {spec.package} package, which is not installed",
                              key="--format", hint=spec.install)
