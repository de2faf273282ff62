"""Checkpoint conversion for the megatron backend, outside the training job.

Megatron-Bridge's conversions are collective ("must be called by all ranks") and build a temporary
process group of their own when none exists. Run on rank 0 of a job while the other ranks wait in
a barrier, they hang. So they run in processes of their own, before and after the job
(`megatron_weights` does the conversions through Megatron-Bridge's API):

* `import_checkpoint` (launching process, before the launcher starts; also ``recipeforge
  convert-checkpoint RECIPE``): Hugging Face -> Megatron distributed checkpoint, cached under
  ``$RECIPEFORGE_CACHE/megatron`` by model id, revision, ``trust_remote_code`` and layer spec.
  Parallel sizes are not part of the key: the checkpoint is written in ``torch_dist`` format at
  TP=PP=1 and Megatron-Core's distributed checkpointing reshards it to the job's layout when it loads.
* `convert_to_megatron` / `convert_to_hf` (``recipeforge convert-checkpoint RECIPE -o DIR
  [--tensor-parallel N] [--to-hf CHECKPOINT]``): either direction into a folder of one's choice, at
  any tensor-parallel size (that many gloo processes).
* `export_final` (launching process, after the job): the last Megatron checkpoint -> final/ in
  Hugging Face format: full weights with `megatron_weights.megatron_to_hf`, or for LoRA the adapter in
  PEFT format with ``AutoBridge.export_adapter_ckpt`` (the same final/ as the other backends; the LoRA
  merge of ``output.merge_adapter`` is then recipeforge's usual one).

APIs as of Megatron-Bridge 0.6 (`megatron/bridge/models/conversion/auto_bridge.py`). Megatron is
imported inside the functions only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from recipeforge.backends.megatron_bridge import auto_bridge
from recipeforge.errors import RecipeError
from recipeforge.outputs.weights import staged_folder

if TYPE_CHECKING:
    from recipeforge.config.schema import Recipe
    from recipeforge.outputs.run_dir import RunDir

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's record of its newest iter_* folder


def _cache_root() -> Path:
    from recipeforge.components.lm_data import default_cache_root

    return default_cache_root() / "megatron"


def cache_key(model: str, revision: str | None, trust_remote_code: bool, spec: str = "transformer_engine") -> str:
    """The converted checkpoint's folder name: readable model name + hash of what changes the weights
    and of the layer spec (`megatron_weights.layer_spec_name`), whose weight names differ."""
    ident: dict[str, str | bool | None] = {"model": model, "revision": revision, "trust_remote_code": trust_remote_code}
    if spec != "transformer_engine":  # keys written before the spec was part of them stay valid
        ident["spec"] = spec
    text = json.dumps(ident, sort_keys=True)
    name = "".join(c if c.isalnum() or c in "-._" else "-" for c in Path(model).name or model)[:60]
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def hf_source(recipe: Recipe, run_root: Path | None) -> str:
    """Where the Hugging Face weights come from: the recipe's model, or for a built-in ``tiny:``
    model its random-init weights written to RUN/base_model (they exist nowhere else)."""
    from recipeforge.components.tiny_spec import tiny_arch

    name = recipe.model.name_or_path
    arch = tiny_arch(name)
    if arch is None:
        return name
    if run_root is None:
        raise RecipeError(f"{name} is built at run time; convert it inside a run (recipeforge train)",
                          key="model.name_or_path")
    from recipeforge.components.models import load_model
    from recipeforge.components.tiny_spec import TINY_CONFIGS
    from recipeforge.components.tokenizer import load_tokenizer
    from recipeforge.outputs.weights import save_base_model

    base = run_root / "base_model"
    if not (base / "config.json").is_file():
        tok = load_tokenizer(name, vocab_size=TINY_CONFIGS.get(arch, {}).get("vocab_size"))
        # the same weights as the HF stages build for this seed (`TrainerStage.load_model`)
        model = load_model(name, tok, device="cpu", dtype="fp32", seed=recipe.train.seed)
        save_base_model(model, tok, base)
    return str(base)


def import_checkpoint(recipe: Recipe, *, run_root: Path | None = None, cache_root: Path | None = None,
                      log: Callable[[str], None] = print) -> Path:
    """The recipe's model as a Megatron checkpoint, converted once and cached (one process)."""
    from recipeforge.backends.megatron_weights import layer_spec_name
    from recipeforge.components.file_lock import exclusive

    m = recipe.model
    auto_bridge()  # a missing Megatron-Bridge is an error naming the extra before anything is written
    source = hf_source(recipe, run_root)
    if source != m.name_or_path:  # a tiny model: its weights live with the run
        assert run_root is not None  # `hf_source` refuses a tiny model without a run
        out, lock = run_root / "megatron_base", run_root / ".megatron_base.lock"
    else:
        root = cache_root or _cache_root()
        out = root / cache_key(m.name_or_path, m.revision, m.trust_remote_code, layer_spec_name())
        lock = root / f".{out.name}.lock"
    with exclusive(lock):
        if (out / "done.json").is_file():
            log(f"megatron: converted checkpoint {out} (cached)")
            return out
        log(f"megatron: converting {m.name_or_path} to a Megatron checkpoint in {out}")
        _write_converted(recipe, source, out, tensor_parallel=1)
    return out


def _write_converted(recipe: Recipe, source: str, out: Path, *, tensor_parallel: int) -> None:
    """`source` converted into out/ckpt, with out/done.json written last (a folder without it is not
    taken as converted)."""
    from recipeforge.backends.megatron_weights import convert, layer_spec_name

    m = recipe.model
    with staged_folder(out) as tmp:
        convert({"direction": "hf_to_megatron", "source": source, "dest": str(tmp / "ckpt"),
                 "trust_remote_code": m.trust_remote_code, "revision": m.revision}, tensor_parallel=tensor_parallel)
        (tmp / "done.json").write_text(json.dumps({"model": m.name_or_path, "revision": m.revision,
                                                   "tensor_parallel": tensor_parallel,
                                                   "layer_spec": layer_spec_name()}) + "\n")


def convert_to_megatron(recipe: Recipe, out: Path, *, tensor_parallel: int = 1, log: Callable[[str], None] = print) -> Path:
    """The recipe's model as a Megatron checkpoint in out/ckpt, saved at `tensor_parallel` (that many
    gloo processes). A ``tiny:`` model's Hugging Face weights are written to out/base_model first."""
    auto_bridge()
    out.mkdir(parents=True, exist_ok=True)
    source = hf_source(recipe, out)
    entry = out / "megatron"
    log(f"megatron: converting {recipe.model.name_or_path} to a Megatron checkpoint in {entry} "
        f"(tensor parallel {tensor_parallel})")
    _write_converted(recipe, source, entry, tensor_parallel=tensor_parallel)
    return base_checkpoint(entry)


def convert_to_hf(recipe: Recipe, checkpoint: Path, out: Path, *, tensor_parallel: int = 1,
                  log: Callable[[str], None] = print) -> Path:
    """The Megatron checkpoint `checkpoint` of the recipe's model as Hugging Face safetensors in `out`,
    loaded at `tensor_parallel` (that many gloo processes; any saved parallel size is resharded)."""
    import tempfile

    from recipeforge.backends.megatron_weights import convert

    auto_bridge()
    if not (checkpoint / "run_config.yaml").is_file() and not list(checkpoint.glob("iter_*")):
        raise RecipeError(f"{checkpoint} is not a Megatron checkpoint (no run_config.yaml, no iter_* folders)",
                          hint="give the ckpt folder `recipeforge convert-checkpoint RECIPE -o DIR` wrote, or a "
                               "run's checkpoints folder")
    m = recipe.model
    with tempfile.TemporaryDirectory(prefix="recipeforge-reference-") as ref:
        # the Hugging Face model the checkpoint came from gives the export its config and tokenizer;
        # a tiny model is built again (the same config and tokenizer, whatever its weights)
        reference = hf_source(recipe, Path(ref))
        log(f"megatron: exporting {checkpoint} to {out} (tensor parallel {tensor_parallel})")
        with staged_folder(out) as tmp:
            convert({"direction": "megatron_to_hf", "reference": reference, "checkpoint": str(checkpoint),
                     "dest": str(tmp), "trust_remote_code": m.trust_remote_code, "revision": m.revision},
                    tensor_parallel=tensor_parallel)
    return out


def base_checkpoint(converted: Path) -> Path:
    """The Megatron checkpoint folder inside a converted entry (``pretrained_checkpoint``)."""
    return converted / "ckpt"


def latest_checkpoint(checkpoints: Path) -> Path:
    """The newest ``iter_*`` folder Megatron saved (it records the number in a tracker file)."""
    tracker = checkpoints / TRACKER
    if tracker.is_file():
        return checkpoints / f"iter_{int(tracker.read_text().strip()):07d}"
    found = sorted(checkpoints.glob("iter_*"))
    if not found:
        raise RecipeError(f"Megatron wrote no checkpoint under {checkpoints}", key="output.save_steps")
    return found[-1]


def export_final(recipe: Recipe, run: RunDir, *, log: Callable[[str], None] = print) -> Path:
    """final/ from the job's last Megatron checkpoint, in one process after the job ended: Hugging
    Face safetensors (full fine-tuning, pretraining) or a PEFT adapter (LoRA), plus the tokenizer."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # The bridge would run its collectives in the job's group with only this rank taking part.
        raise RuntimeError("export_final runs in a process of its own, after the training job ended")
    from recipeforge.backends.megatron_weights import megatron_to_hf

    m = recipe.model
    source = latest_checkpoint(run.checkpoints)
    reference = hf_source(recipe, run.root)
    final = run.final
    with staged_folder(final) as tmp:
        if recipe.adapter.type == "lora":
            log(f"megatron: exporting the LoRA adapter of {source} to {final}")
            bridge = auto_bridge().from_hf_pretrained(reference, trust_remote_code=m.trust_remote_code,
                                                      **({"revision": m.revision} if m.revision else {}))
            bridge.export_adapter_ckpt(peft_checkpoint=str(source), output_path=str(tmp), show_progress=False)
        else:
            log(f"megatron: exporting {source} to {final}")
            megatron_to_hf(reference, source, tmp, trust_remote_code=m.trust_remote_code, revision=m.revision)
        _save_tokenizer(recipe, run, tmp)
    return final


def _save_tokenizer(recipe: Recipe, run: RunDir, out: Path) -> None:
    """The tokenizer the data was tokenized with (chat template included), next to the weights as in
    every backend's final/; the Megatron stage keeps it in RUN/megatron_data/tokenizer."""
    kept = run.root / "megatron_data" / "tokenizer"
    if not kept.is_dir():
        raise RecipeError(f"the training job left no tokenizer in {kept}", key="distributed.backend")
    for item in kept.iterdir():
        shutil.copy2(item, out / item.name)
