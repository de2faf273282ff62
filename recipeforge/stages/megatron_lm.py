"""Pretraining and SFT on Megatron-Bridge's training loop, on the same stage protocol as the others.

The data comes from the shared data step (`LMStage.prepare_data`: the cached, tokenized, masked and
packed rows every backend trains on) and is written once, by the main process, in the formats
Megatron reads (`components.megatron_data`). Every rank then builds the same configuration and calls
Megatron-Bridge's `finetune` (every recipe starts from a Hugging Face model, so pretraining is
continued pretraining: `finetune` is `pretrain` from `pretrained_checkpoint`). No rank runs a
collective alone: the Hugging Face -> Megatron conversion happened before the job and the export to
final/ happens after it, in the launching process (`backends.megatron_convert`).

What is Megatron-specific and lives with the backend arrives as a plain callable in
``ctx.backend_kwargs["build_config"]`` (data description, iterations -> ``ConfigContainer``); this
module never imports a backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.stages.lm import LMStage

if TYPE_CHECKING:
    from recipeforge.stages.context import StageContext

DATA_DIR = "megatron_data"


class MegatronLMStage(LMStage):
    """Causal-LM pretraining or SFT through Megatron-Bridge (`stage` comes from the recipe)."""

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.stage = ctx.recipe.stage
        self.config: Any = None  # Megatron-Bridge's ConfigContainer, built by the backend's `build_config`
        self.megatron_data: dict[str, Any] = {}
        self.train_iters = 0

    @property
    def data_dir(self) -> Path:
        return self.context.run.root / DATA_DIR

    def setup(self) -> None:
        """Tokenizer and data (the shared step), Megatron's data files (main process), then the
        configuration on every rank."""
        from recipeforge.components.data_checks import check_data_numbers

        ctx = self.context
        check_data_numbers(self.recipe, ctx.plan, self.data or self.prepare(), log=ctx.log if ctx.dist.is_main
                           else (lambda message: None))
        if ctx.dist.is_main:
            self.write_data()
        ctx.barrier()  # every rank calls it: the files exist before anyone reads them
        self.megatron_data = json.loads((self.data_dir / "megatron_data.json").read_text())
        self.train_iters = self.iterations(self.megatron_data["training"]["rows"])
        build = ctx.backend_kwargs.get("build_config")
        if build is None:
            raise RuntimeError("the megatron stage runs with the megatron backend (it supplies build_config)")
        self.config = build(data=self.megatron_data, train_iters=self.train_iters)

    def write_data(self) -> dict[str, Any]:
        """Write the training rows for Megatron and keep the tokenizer with them (export puts it in final/)."""
        from recipeforge.components.megatron_data import write_megatron_data

        tok = self.tokenizer
        info = write_megatron_data(self.prepared, self.data_dir, vocab_size=len(tok), eos_id=tok.eos_token_id)
        tok.save_pretrained(str(self.data_dir / "tokenizer"))
        dropped = info["training"].get("targets_dropped_after_eos", 0)
        self.data = self.prepared.with_stats(megatron_targets_dropped_after_eos=dropped)
        if dropped:
            # Megatron-Bridge's packed collate function masks every position whose input is EOS.
            self.ctx.log(f"megatron: {dropped} trained tokens follow an EOS token ({tok.eos_token!r}); "
                         "Megatron-Bridge does not train them (the other backends do)")
        return info

    def iterations(self, rows: int) -> int:
        """Optimizer steps: train.max_steps, or the epochs over the rows at the global batch."""
        t = self.recipe.train
        if t.max_steps:
            return t.max_steps
        return max(1, math.ceil((t.epochs or 1.0) * rows / self.context.plan.global_batch_size))

    def train(self) -> dict[str, Any]:
        """Megatron-Bridge's loop, on every rank."""
        from megatron.bridge.training.finetune import finetune
        from megatron.bridge.training.gpt_step import forward_step

        finetune(config=self.config, forward_step_func=forward_step)
        checkpoints = self.context.run.checkpoints
        stopped_at = last_saved_iteration(checkpoints)
        if stopped_at is not None and stopped_at < self.train_iters:
            # Megatron's signal handler saved this iteration and left its loop early: a stop request.
            from recipeforge.stages.preemption import Preempted

            raise Preempted("SIGTERM", stopped_at, checkpoints / f"iter_{stopped_at:07d}")
        return {"train_iters": self.train_iters}

    def save(self) -> Path:
        """The job's output is Megatron's checkpoint folder; final/ is exported from it after the job,
        in one process (`backends.megatron_convert.export_final`). Nothing collective here."""
        return self.context.run.checkpoints


def last_saved_iteration(checkpoints: Path) -> int | None:
    """The iteration of Megatron's newest checkpoint (its ``latest_checkpointed_iteration.txt``), if any."""
    try:
        return int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None
