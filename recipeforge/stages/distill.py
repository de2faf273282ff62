"""Knowledge distillation (`stage: distill`): the student (the recipe's model) learns a teacher's
next-token distributions on the SFT data path.

Each step the student runs forward, the teacher gives its top-k log-probs on the same token ids
(`components.teacher`), and the loss is ``sft_weight`` x cross-entropy on the completion tokens plus
``(1 - sft_weight)`` x the divergence over the teacher's k tokens and a rest bucket
(`components.distill_loss`). With ``on_policy`` > 0 (GKD's lambda), that share of steps (drawn from
the run's seed and the step number, so a resumed run draws the same) trains on completions the
student samples from the rows' prompts: the loss there is the divergence on the sampled tokens.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stages.lm import LMStage

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer

    from recipeforge.components.teacher import Teacher
    from recipeforge.components.vocab import VocabChange
    from recipeforge.config.schema.distill import DistillConfig
    from recipeforge.stages.context import RecipeContext


class DistillLog:
    """The distillation values of the training steps since the last log record, averaged when taken."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, **values: float) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)
            self.counts[key] = self.counts.get(key, 0) + 1

    def take(self) -> dict[str, Any]:
        """The means since the last call (the stage's extra log source: they land in metrics.jsonl)."""
        out = {f"distill/{k}": round(v / self.counts[k], 6) for k, v in self.sums.items()}
        self.sums, self.counts = {}, {}
        return out


def on_policy_step(seed: int, step: int, share: float) -> bool:
    """Whether training step `step` samples its completions from the student (deterministic in the seed)."""
    return share > 0 and random.Random(seed * 1_000_003 + step).random() < share


class DistillStage(LMStage):
    """Distillation from a colocated or served teacher on SFT rows (see the module docstring)."""

    stage = "distill"

    def __init__(self, ctx: RecipeContext):
        super().__init__(ctx)
        self.teacher: Teacher | None = None
        self.distill_log = DistillLog()

    @property
    def settings(self) -> DistillConfig:
        return self.recipe.distill  # type: ignore[attr-defined, no-any-return]  # a DistillRecipe

    def check(self) -> None:
        """The base checks, and what the teacher needs on this plan (before anything loads)."""
        super().check()
        from recipeforge.config.schema.rules import distill_problems

        for problem in distill_problems(self.recipe):
            raise RecipeError(problem.message, key=".".join(map(str, problem.path)),
                              location=self.ctx.locate(problem.path), hint=problem.hint)
        t = self.settings.teacher
        if t.load_in_4bit:
            from recipeforge.components.teacher import four_bit_config
            from recipeforge.components.models import resolve_dtype

            device = self.context.plan.device
            four_bit_config(device, resolve_dtype(self.recipe.model.dtype, device),
                            location=self.ctx.locate(("distill", "teacher", "load_in_4bit")))

    def prepare_data(self) -> PreparedData:
        """The SFT data, after checking that a colocated teacher reads the same tokens as the student."""
        data = super().prepare_data()
        t = self.settings.teacher
        if t.name_or_path is not None:
            from recipeforge.components.tokenizer import load_tokenizer
            from recipeforge.components.vocab_files import first_difference

            location = self.ctx.locate(("distill", "teacher", "name_or_path"))
            theirs = load_tokenizer(t.name_or_path, revision=t.revision,
                                    trust_remote_code=self.recipe.model.trust_remote_code,
                                    vocab_size=len(self.tokenizer) if t.name_or_path.startswith("tiny:") else None,
                                    location=location, key="distill.teacher.name_or_path")
            difference = first_difference(_base_vocab(self.tokenizer, self.vocab), theirs.get_vocab())
            if difference is not None:
                raise RecipeError(f"the teacher's tokenizer differs from the student's: {difference}",
                                  key="distill.teacher.name_or_path", location=location,
                                  hint="distill from a teacher with the student's tokenizer (the divergence "
                                       "compares the same token ids)")
        return data

    def load_model(self) -> PreTrainedModel:
        """The student (as for SFT), then the teacher on its device and in its dtype."""
        import time

        from recipeforge.components.models import resolve_dtype
        from recipeforge.components.teacher import build_teacher

        model = super().load_model()
        started = time.perf_counter()
        plan, m = self.context.plan, self.recipe.model
        self.teacher = build_teacher(self.settings.teacher, self.tokenizer, device=plan.device,
                                     dtype=resolve_dtype(m.dtype, plan.device), trust_remote_code=m.trust_remote_code,
                                     attn_implementation=m.attn_implementation, seed=self.recipe.train.seed,
                                     vocab_size=len(self.tokenizer), locate=self.ctx.locate)
        t = self.settings.teacher
        self.ctx.log(f"teacher: {t.name_or_path or t.url} ready in {time.perf_counter() - started:.1f}s "
                     f"({self.settings.loss}, top {self.settings.top_k} tokens, temperature {self.settings.temperature})")
        return model

    def build_trainer(self) -> Trainer:
        self.extra_log_sources.append(self.distill_log.take)  # read when the callbacks are made
        trainer = super().build_trainer()
        # The loss is a mean per micro-batch: the trainer divides by the accumulation steps itself.
        trainer.model_accepts_loss_kwargs = False
        return trainer

    def trainer_type(self, base: type[Trainer]) -> type[Trainer]:
        stage = self

        class DistillTrainer(base):  # type: ignore[misc]  # transformers is untyped here (`Any`)
            def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                             num_items_in_batch: torch.Tensor | int | None = None) -> Any:
                return stage.compute_loss(self, model, inputs, return_outputs)

        DistillTrainer.__name__ = f"Distill{base.__name__}"
        return DistillTrainer

    # --- the loss -------------------------------------------------------------------------------
    def compute_loss(self, trainer: Trainer, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool) -> Any:
        """Student forward, teacher top-k on the same ids, CE and divergence mixed by `sft_weight`."""
        from recipeforge.components.distill_loss import completion_cross_entropy, divergence

        s = self.settings
        assert self.teacher is not None
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        sampled = model.training and on_policy_step(self.recipe.train.seed, trainer.state.global_step, s.on_policy)
        if sampled:
            inputs, labels = self.sample(trainer, model, inputs["input_ids"], labels)
        # The teacher first: its full-vocabulary logits are reduced to the top-k before the student's
        # activations exist, so the two never peak together (the planner sizes it so).
        top = self.teacher_top_k(inputs, labels)
        outputs = model(**inputs)
        logits = outputs.logits
        div = divergence(logits, top.logprobs.to(logits.device), top.ids.to(logits.device), labels,
                         loss=s.loss, beta=s.beta, temperature=s.temperature)
        if sampled:
            loss = div.loss
            ce = None
        else:
            ce = completion_cross_entropy(logits, labels)
            loss = div.loss if s.sft_weight == 0 else s.sft_weight * ce + (1 - s.sft_weight) * div.loss
        if model.training and div.positions:
            self.distill_log.add(kl=div.loss.item(), teacher_mass=div.teacher_mass.item(),
                                 on_policy=float(sampled), **({"ce": ce.item()} if ce is not None else {}))
        return (loss, outputs) if return_outputs else loss

    def teacher_top_k(self, inputs: dict[str, Any], labels: torch.Tensor) -> Any:
        """The teacher's top-k on the batch; a packed row is scored document by document (its position
        ids restart at each), so the teacher sees what the student sees."""
        import torch

        from recipeforge.components.teacher import TeacherTopK

        assert self.teacher is not None
        s = self.settings
        ids = inputs["input_ids"]
        positions = inputs.get("position_ids")
        if positions is None or "attention_mask" in inputs:  # unpacked (an on-policy batch has both)
            mask = inputs.get("attention_mask")
            return self.teacher.top_k(ids, mask if mask is not None else torch.ones_like(ids), k=s.top_k,
                                      temperature=s.temperature)
        pieces = []  # (row, start, end) of each document that carries a label
        for row in range(ids.size(0)):
            starts = (positions[row] == 0).nonzero().flatten().tolist() + [ids.size(1)]
            for a, b in zip(starts, starts[1:]):
                if bool((labels[row, a:b] != -100).any()) or (b < ids.size(1) and labels[row, b] != -100):
                    pieces.append((row, a, b))
        k = s.top_k
        logprobs = torch.zeros((*ids.shape, k), dtype=torch.float32)
        top_ids = torch.zeros((*ids.shape, k), dtype=torch.long)
        if not pieces:
            return TeacherTopK(logprobs, top_ids)
        width = max(b - a for _, a, b in pieces)
        batch = torch.zeros((len(pieces), width), dtype=ids.dtype, device=ids.device)
        mask = torch.zeros_like(batch)
        for i, (row, a, b) in enumerate(pieces):
            batch[i, :b - a], mask[i, :b - a] = ids[row, a:b], 1
        got = self.teacher.top_k(batch, mask, k=k, temperature=s.temperature)
        kk = got.ids.size(-1)
        logprobs, top_ids = logprobs[..., :kk], top_ids[..., :kk]
        for i, (row, a, b) in enumerate(pieces):
            logprobs[row, a:b] = got.logprobs[i, :b - a].cpu()
            top_ids[row, a:b] = got.ids[i, :b - a].cpu()
        return TeacherTopK(logprobs, top_ids)

    def sample(self, trainer: Trainer, model: torch.nn.Module, input_ids: torch.Tensor,
               labels: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
        """On-policy rows: each row's prompt (the tokens before its first labelled token), left-padded,
        and `max_new_tokens` the student samples after it; labels on the sampled tokens up to and with
        the first end-of-turn token."""
        import torch

        s, pad = self.settings, self.tokenizer.pad_token_id
        prompts = []
        for row in range(input_ids.size(0)):
            labelled = (labels[row] != -100).nonzero().flatten()
            prompts.append(input_ids[row, :int(labelled[0]) if labelled.numel() else input_ids.size(1)])
        width = max(1, max(len(p) for p in prompts))
        batch = torch.full((len(prompts), width), pad, dtype=input_ids.dtype, device=input_ids.device)
        mask = torch.zeros_like(batch)
        for i, p in enumerate(prompts):
            if len(p):
                batch[i, width - len(p):], mask[i, width - len(p):] = p, 1
        student = trainer.accelerator.unwrap_model(model)
        student.eval()
        try:
            with torch.no_grad():
                out = student.generate(input_ids=batch, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                                       do_sample=True, temperature=s.sampling_temperature, top_k=0, top_p=1.0,
                                       pad_token_id=pad, use_cache=True)
        finally:
            student.train()
        new = out[:, width:]
        eos = student.generation_config.eos_token_id
        eos = torch.tensor(eos if isinstance(eos, list) else [eos] if eos is not None else [], device=new.device)
        is_end = torch.isin(new, eos)
        alive = (is_end.long().cumsum(-1) - is_end.long()) == 0  # up to and with the first end token
        new = torch.where(alive, new, torch.full_like(new, pad))
        ids = torch.cat([batch, new], dim=1)
        attention = torch.cat([mask, alive.to(mask.dtype)], dim=1)
        new_labels = torch.cat([torch.full_like(batch, -100), torch.where(alive, new, torch.full_like(new, -100))], 1)
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        return {"input_ids": ids, "attention_mask": attention, "position_ids": positions}, new_labels


def _base_vocab(tokenizer: PreTrainedTokenizerBase, vocab: VocabChange | None) -> dict[str, int]:
    """The student tokenizer's vocabulary without the tokens the recipe added (the teacher has none of them)."""
    added = set(getattr(vocab, "new_ids", ()) or ())
    return {tok: i for tok, i in tokenizer.get_vocab().items() if i not in added}
