"""The README.md of an export folder: what it holds, how each consumer loads it, its self-check."""

from __future__ import annotations

from pathlib import Path

from recipeforge.tools.exporters.formats import Family, FormatSpec

_LLAMA_CPP = ("python convert_hf_to_gguf.py {safetensors} --outtype q8_0 --outfile model.gguf   "
              "# in a clone of github.com/ggml-org/llama.cpp; then: llama-cli -m model.gguf")


def render_readme(spec: FormatSpec, *, run_dir: Path, out: Path, settings: dict, check: dict | None) -> str:
    """The README text for the export of `run_dir` in `spec`'s format, written to `out`."""
    # The package transformers loads each family with is named like the family (torchao, compressed-tensors).
    needs = "" if spec.family == Family.SAFETENSORS else f"  # needs: pip install {spec.family}"
    # llama.cpp converts full-precision weights only: a quantized export points at the safetensors one.
    source = out if spec.family == Family.SAFETENSORS else Path(run_dir) / "export-safetensors"
    lines = [f"# {Path(run_dir).name}: {spec.summary}", "",
             f"Exported by `recipeforge export {run_dir} --format {spec.name}`."
             + "".join(f" {k}: {v}." for k, v in settings.items() if v), "", "## Load it", "",
             "transformers:", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer" + needs,
             f'model = AutoModelForCausalLM.from_pretrained("{out}", dtype="auto")',
             f'tokenizer = AutoTokenizer.from_pretrained("{out}")', "```", "",
             "vLLM:", "", "```", f"vllm serve {out}", "```", "", "llama.cpp (GGUF):", "", "```"]
    if spec.family != Family.SAFETENSORS:
        lines.append(f"recipeforge export {run_dir} --format safetensors   # llama.cpp converts full weights")
    lines += [_LLAMA_CPP.format(safetensors=source), "```", ""]
    if check:
        verdict = "passed" if check["passed"] else "FAILED"
        lines += ["## Self-check", "",
                  f"Loaded back with transformers and compared with the unquantized model on {check['texts_from']}: "
                  f"perplexity {check['reference_perplexity']:.4g} -> {check['export_perplexity']:.4g} "
                  f"({check['perplexity_change']:+.3%}; bound {check['max_perplexity_change']:.2%}), greedy tokens "
                  f"{check['greedy_match']:.0%} equal: **{verdict}**. The numbers are in export.json.", ""]
    return "\n".join(lines)
