"""A transformers `Trainer` reading a streamed corpus (`components.lm_stream.StreamedLM`).

Three things differ from a trainer on a cached dataset:

- The data loader reads this process's own stream, one process, nothing prefetched (the stream's
  position is then exactly what was trained on). Accelerate's wrapping is left out on purpose: it
  would read the whole stream on every process and keep every N-th batch, or read it on rank 0 and
  send the batches round.
- Every checkpoint keeps each process's stream position (``stream/rank-<r>.json``), written into the
  checkpoint before it is published, so a complete checkpoint always has them.
- A resume restores the position instead of replaying the data loader up to the checkpoint's step
  (``ignore_data_skip``, set by the stage): consumed rows are neither read again nor trained twice.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader
    from transformers import TrainerState, TrainingArguments

    from recipeforge.components.lm_stream import StreamedLM

    class _Trainer:
        """What the mixin uses of transformers' `Trainer`, the class it is put in front of."""

        train_dataset: StreamedLM  # what the stage hands a streamed trainer
        data_collator: Callable[[list[dict[str, Any]]], Any]
        state: TrainerState
        args: TrainingArguments
        _train_batch_size: int

        def train(self, resume_from_checkpoint: str | None = None, *args: Any, **kwargs: Any) -> Any: ...

        def _save_checkpoint(self, model: torch.nn.Module, trial: object) -> None: ...

        def _get_output_dir(self, trial: object) -> str: ...
else:
    _Trainer = object


class _StreamedTrainer(_Trainer):
    """The hooks `streamed` puts in front of a trainer class (a mixin: `super()` is the trainer)."""

    def get_train_dataloader(self) -> DataLoader[dict[str, Any]]:
        from torch.utils.data import DataLoader

        stream = self.train_dataset
        collate = self.data_collator
        if stream.order_log is not None:
            collate = _OrderLogged(collate, stream.order_log, lambda: self.state.global_step + 1)
        return DataLoader(stream, batch_size=self._train_batch_size, collate_fn=collate, num_workers=0,
                          pin_memory=self.args.dataloader_pin_memory)

    def train(self, resume_from_checkpoint: str | None = None, *args: Any, **kwargs: Any) -> Any:
        stream = self.train_dataset
        if resume_from_checkpoint:
            stream.restore(Path(resume_from_checkpoint), self.args.process_index, self.args.world_size)
        if stream.order_log is not None:
            from recipeforge.components.lm_stream import trim_order

            # The steps after the checkpoint are trained again: their earlier lines go.
            trim_order(stream.order_log, _step_of(resume_from_checkpoint) if resume_from_checkpoint else 0)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model: torch.nn.Module, trial: object) -> None:
        super()._save_checkpoint(model, trial)
        # Under `outputs.atomic.crash_safe`, the output folder is still the staging one here.
        checkpoint = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        self.train_dataset.save(checkpoint, self.args.process_index)


def _step_of(checkpoint: str | Path) -> int:
    """The global step a checkpoint was saved at (its trainer state)."""
    import json

    return int(json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"])


class _OrderLogged:
    """A collator that first appends the batch's rows to the ``data.stream_log`` file of this process."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], Any], path: Path, step: Callable[[], int]):
        self.collate, self.path, self.step = collate, Path(path), step
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        from recipeforge.components.lm_stream import write_order

        write_order(self.path, self.step(), rows)
        return self.collate(rows)


@lru_cache(maxsize=None)
def streamed(trainer_cls: type) -> type:
    """`trainer_cls` reading a `StreamedLM` (one subclass per trainer class)."""

    class StreamedTrainer(_StreamedTrainer, trainer_cls):  # type: ignore[misc]
        pass

    StreamedTrainer.__name__ = StreamedTrainer.__qualname__ = f"Streamed{trainer_cls.__name__}"
    return StreamedTrainer


def order_log_path(run_root: Path, rank: int) -> Path:
    """Where ``data.stream_log`` writes the rows of process `rank`."""
    return Path(run_root) / "data_order" / f"rank-{rank}.jsonl"

