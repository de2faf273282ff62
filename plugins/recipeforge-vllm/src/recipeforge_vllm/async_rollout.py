"""Asynchronous GRPO on a vLLM server (`grpo.max_staleness` > 0): the server generates the next
steps' completions while the trainer trains.

The trainer stays TRL's `GRPOTrainer`; its ``rollout_func`` hook is this rollout, and its training
data loader is read ahead (`LookAheadLoader`) so that the prompts of the next `max_staleness`
optimizer steps are known before those steps start. At each step boundary (the first generation of
an optimizer step, where TRL syncs its own vLLM client) the rollout

1. waits for the generations in flight, so that no request sees the weights change under it,
2. pushes the trained weights to the server (`ServerRollout.sync`: safetensors in the run directory,
   reloaded in place by the server),
3. sends the prompts of the following steps, up to `max_staleness` steps ahead, to the server, tagged
   with the version of the weights (the optimizer step) they are generated with,

then hands the trainer the completions of the current step, generated up to `max_staleness` steps
ago. A background thread talks to the server; the trainer computes its loss meanwhile. TRL's
importance-sampling correction (truncated: each token's loss weighted by exp(trainer log-prob -
sampler log-prob), clipped at ``vllm_importance_sampling_clip_max``) corrects for both the lag and
the numerical difference between vLLM and the trainer.

Each step's records carry ``rollout/staleness`` (steps between the generating and the trained
weights, mean over the step's generation batches; one batch a step unless TRL's steps_per_generation
says otherwise), ``rollout/wait_s``
(seconds the trainer waited for completions) and TRL's ``sampling/sampling_logp_difference/*``
(the sampler/trainer log-prob gap) and ``sampling/importance_sampling_ratio/*``.

This is TRL's `AsyncGRPOTrainer` (trl.experimental.async_grpo, TRL 1.16) idea — a bounded-staleness
rollout queue tagged with model versions, truncated importance sampling — on TRL's stable
`GRPOTrainer`: the experimental trainer needs CUDA (a FlashAttention-3 tree-attention kernel, NCCL
weight transfer) and builds its own model, which recipeforge's backends and planner could not drive.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Iterator

from recipeforge_vllm.deadline import ServerTimeouts
from recipeforge_vllm.server_rollout import ServerRollout, generate, record


class _Batch:
    """One generation batch: its prompts, and once sent, the weights version and the pending completions."""

    def __init__(self, prompts: list):
        self.prompts = prompts
        self.version = -1
        self.future: Future | None = None


class AsyncServerRollout(ServerRollout):
    """TRL ``rollout_func`` that generates up to `max_staleness` optimizer steps ahead on a vLLM server."""

    def __init__(self, timeouts: ServerTimeouts, connect_s: float, max_staleness: int):
        super().__init__(timeouts, connect_s)
        self.max_staleness = max_staleness
        self.ahead: deque[_Batch] = deque()  # prompts read ahead, oldest first; the sent ones lead
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._trainer: Any = None
        self._waited = 0.0  # seconds this step waited for generations at its boundary

    def attach(self, trainer, *, correction: bool) -> None:
        """Read the trainer's data ahead (the prompts of the next steps), then the correction."""
        self._trainer = trainer
        every = trainer.args.steps_per_generation * trainer.num_iterations  # data batches per generation
        make_loader = trainer.get_train_dataloader

        def get_train_dataloader():
            return LookAheadLoader(make_loader(), self, every=every, depth=self.max_staleness)

        trainer.get_train_dataloader = get_train_dataloader
        super().attach(trainer, correction=correction)

    def expect(self, prompts: list) -> None:
        """The data loader read the prompts of a coming generation batch."""
        self.ahead.append(_Batch(list(prompts)))

    # -- the step boundary ---------------------------------------------------------------------
    def on_new_step(self, trainer) -> None:
        if trainer.state.global_step != self.synced_step:
            start = time.perf_counter()
            for batch in self.ahead:  # 1. nothing in flight while the weights change
                if batch.future is not None:
                    batch.future.exception()
            self._waited += time.perf_counter() - start
            self.sync(trainer)  # 2.
            self.synced_step = trainer.state.global_step
        self._send(trainer)  # 3.

    def _send(self, trainer) -> None:
        """Send read-ahead prompts to the server until the current step and the next `max_staleness`
        steps are under way (the current one may have been sent steps ago)."""
        for batch in list(self.ahead)[:self.max_staleness + 1]:
            if batch.future is None:
                self._submit(batch, trainer)

    def _submit(self, batch: _Batch, trainer) -> None:
        batch.version = self.synced_step
        batch.future = Future()
        # Tokenized here, on the trainer's thread, exactly as TRL's own generation paths do.
        ids = trainer._tokenize_prompts(batch.prompts)[0]
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="rollout-generation", daemon=True)
            self._worker.start()
        self._jobs.put((ids, batch.future))

    def _work(self) -> None:
        """The generation thread: one request to the server at a time, in the order sent."""
        client = None
        while True:
            ids, future = self._jobs.get()
            try:
                if client is None:
                    client = self.new_client()  # every request within the recipe's deadline
                future.set_result(generate(client, self._trainer, ids))
            except BaseException as exc:  # handed to the trainer's thread, which raises it
                future.set_exception(exc)

    # -- the trainer's generation ------------------------------------------------------------------
    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        self.on_new_step(trainer)  # idempotent; TRL calls it first when the correction is on
        batch = self._take(prompts) if trainer.model.training else None
        if batch is None:  # not read ahead (evaluation, the first steps of an epoch, a resumed run)
            batch = _Batch(list(prompts))
            self._submit(batch, trainer)
        assert batch.future is not None
        start = time.perf_counter()
        out = batch.future.result()
        staleness = trainer.state.global_step - batch.version
        waited, self._waited = self._waited + time.perf_counter() - start, 0.0
        record(trainer, "rollout/wait_s", waited)
        record(trainer, "rollout/staleness", staleness)
        return out

    def _take(self, prompts: list) -> _Batch | None:
        """The read-ahead batch of `prompts` (sent now if it was not yet), dropping any before it
        that the trainer skipped."""
        while self.ahead:
            batch = self.ahead.popleft()
            if batch.prompts == prompts:
                if batch.future is None:
                    self._submit(batch, self._trainer)
                return batch
        return None


class LookAheadLoader:
    """The trainer's data loader, read `depth` generation batches ahead of what the trainer takes.

    Every `every` data batches make one generation batch (TRL repeats a generation batch once per
    gradient-accumulation step); the first of each is announced to the rollout (`expect`) as soon as
    it is read. Everything else (length, epochs, samplers) is the wrapped loader's."""

    def __init__(self, loader: Any, rollout: AsyncServerRollout, *, every: int, depth: int):
        self.loader, self.rollout, self.every, self.depth = loader, rollout, max(1, every), depth

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.loader)
        buffered: deque = deque()
        read = taken = 0
        exhausted = False
        while True:
            # Read through the generation batch `depth` batches after the one being taken.
            through = (taken // self.every + 1 + self.depth) * self.every
            while not exhausted and read < through:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                if read % self.every == 0:
                    self.rollout.expect([row["prompt"] for row in item])
                buffered.append(item)
                read += 1
            if not buffered:
                return
            yield buffered.popleft()
            taken += 1
