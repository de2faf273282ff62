"""Merging a LoRA adapter into its base model (merged/), and loading models whole after a sharded run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from recipeforge.errors import RecipeError
from recipeforge.outputs.model_files import read_json_file
from recipeforge.outputs.weights import save_pretrained_atomic


def merge_adapter(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Merge the LoRA adapter in ``run_dir/final`` into its base; write safetensors + tokenizer.

    The base is ``run_dir/base_model`` for tiny models, else the model the adapter names. The result
    loads with plain `transformers.AutoModelForCausalLM.from_pretrained` (a reward model's, whose
    adapter is for sequence classification, with `AutoModelForSequenceClassification`).
    """
    run_dir = Path(run_dir)
    final = run_dir / "final"
    adapter_cfg = final / "adapter_config.json"
    if not final.is_dir():
        raise RecipeError(f"{run_dir} has no final/ model", hint="train the recipe first (recipeforge train)")
    if not adapter_cfg.is_file():
        raise RecipeError(f"{final} holds a full model, not an adapter: there is nothing to merge",
                          hint="load final/ directly with AutoModelForCausalLM.from_pretrained")
    from recipeforge.outputs.model_files import check_model_dir
    from recipeforge.outputs.ownership import check_replaceable

    if out_dir is not None:  # a folder the user names: never the run, its models or a place of theirs
        check_replaceable(Path(out_dir), overwrite=True, key="--output", flag="merging again into it",
                          also=[(run_dir, "the run directory"), (final, "the run's final/ model"),
                                (run_dir / "base_model", "the run's base_model/")])
    check_model_dir(final, what="adapter")
    recipe = _resolved_recipe(run_dir)
    model_cfg = recipe.get("model", {}) if isinstance(recipe, dict) else {}
    model_cfg = model_cfg if isinstance(model_cfg, dict) else {}
    adapter = read_json_file(adapter_cfg)
    if model_cfg.get("trust_remote_code") is True:
        from recipeforge.registry import require_code_trust

        require_code_trust(f"the run's recipe ({run_dir / 'resolved_recipe.yaml'}) sets model.trust_remote_code: "
                           "true, the Python code of its base model's repository",
                           allow_code=recipe.get("allow_code") is True, key="model.trust_remote_code")
    base = _base_path(run_dir, adapter, model_cfg)
    out = Path(out_dir) if out_dir is not None else run_dir / "merged"

    with whole_model_loading():
        return _merge(run_dir, final, base, adapter, model_cfg, out, kind=None if out_dir is None else "merged")


@contextlib.contextmanager
def whole_model_loading() -> Iterator[None]:
    """Load models whole in this process while the block runs. A ZeRO-3 run leaves transformers'
    DeepSpeed config set for the process (the trainer's arguments hold it), under which
    `from_pretrained` partitions what it loads with collectives: after training, rank 0 alone merging
    or evaluating would wait forever for ranks that have finished."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:  # no DeepSpeed integration in this transformers: nothing is partitioned
        yield
        return
    ref = getattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref", None)
    held = ref() if ref is not None else None
    if held is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(held)


def _merge(run_dir: Path, final: Path, base: str, adapter: dict, model_cfg: dict, out: Path,
           kind: str | None = None) -> Path:
    """`merge_adapter`'s work: the base loaded whole, the adapter merged in, the result written to `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    # The base gets the head the adapter was trained with: the LM head, or the one-score head of a
    # reward model (recipeforge's only sequence-classification adapters; a hub base has no score head
    # yet, and would get transformers' default of two labels).
    auto, head = AutoModelForCausalLM, {}
    if adapter.get("task_type") == "SEQ_CLS":
        auto, head = AutoModelForSequenceClassification, {"num_labels": 1}
    # A vision-language model (its processor saved in final/): the base with its tower and projector.
    vision = (final / "processor_config.json").is_file() or (final / "preprocessor_config.json").is_file()
    if vision:
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText

    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(model_cfg.get("dtype", "auto"), "auto")
    from recipeforge.outputs.model_files import check_model_dir, load_failure

    if Path(base).is_dir():
        check_model_dir(Path(base), what="base model")
    try:
        # The adapter trained on whatever precision the base had; merging into an unquantized copy is
        # standard (QLoRA adapters included).
        base_model = auto.from_pretrained(
            base, dtype=dtype, revision=model_cfg.get("revision") if base == model_cfg.get("name_or_path") else None,
            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)), **head)
    except OSError as exc:
        raise RecipeError(f"cannot load the base model '{base}' to merge into: {str(exc).splitlines()[0]}",
                          hint="the base must be reachable (a local directory, or the hub when online)") from None
    except (RecipeError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # a damaged or foreign base folder: safetensors, JSON, transformers' own errors
        raise load_failure(exc, Path(base), what="base model") from None
    try:
        merged = PeftModel.from_pretrained(base_model, str(final)).merge_and_unload()
    except (RecipeError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # an adapter of another shape or a damaged one
        raise load_failure(exc, final, what="adapter") from None
    if vision:
        from transformers import AutoProcessor

        files = AutoProcessor.from_pretrained(str(final))  # tokenizer, image processor, chat template
    else:
        files = AutoTokenizer.from_pretrained(str(final))
    return save_pretrained_atomic(merged, files, out, kind=kind)


def _resolved_recipe(run_dir: Path) -> dict:
    path = run_dir / "resolved_recipe.yaml"
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}


def _base_path(run_dir: Path, adapter_cfg: dict, model_cfg: dict) -> str:
    local = run_dir / "base_model"
    if local.is_dir():
        return str(local)
    named = adapter_cfg.get("base_model_name_or_path") or model_cfg.get("name_or_path")
    if not named:
        raise RecipeError(f"cannot tell which base model the adapter in {run_dir}/final belongs to")
    return named
