"""The distillation divergence between a student's logits and a teacher's top-k log-probs (pure torch).

At each position the two distributions are compared over k + 1 outcomes: the teacher's k most likely
next tokens, and one "rest of the vocabulary" bucket that holds what the k leave (1 - their summed
probability, for the teacher and for the student alike). A served teacher sends only its top tokens,
so a colocated and a served teacher train the same objective; with k = the vocabulary size the rest
bucket is empty and the divergence is the full-vocabulary one.

Positions follow a causal LM: the logits (and the teacher's log-probs) at position t predict token
t + 1, so position t counts when ``labels[t + 1] != -100``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

IGNORE = -100
# The floor of a bucket's probability (the rest bucket when the k tokens hold everything): keeps
# 0 * log 0 at 0 and the log finite, far below any mass that matters.
_FLOOR = 1e-12
_LOG_FLOOR = math.log(_FLOOR)


@dataclass(frozen=True)
class Divergence:
    """The mean divergence over the counted positions (differentiable in the student's logits), the
    teacher's mean top-k probability mass there (detached, for logging) and how many positions counted."""

    loss: torch.Tensor
    teacher_mass: torch.Tensor
    positions: int


def completion_mask(labels: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: position t counts when token t + 1 carries a label (the last position never does)."""
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != IGNORE
    return mask


def _with_rest(logp_k: torch.Tensor, rest_logp: torch.Tensor) -> torch.Tensor:
    """[..., k] log-probs and the [...] log-prob of the rest bucket as [..., k + 1], floored."""
    return torch.cat([logp_k, rest_logp.unsqueeze(-1)], dim=-1).clamp_min(_LOG_FLOOR)


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension, from log-probs."""
    return (logp.exp() * (logp - logq)).sum(-1)


def divergence(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, teacher_ids: torch.Tensor,
               labels: torch.Tensor, *, loss: str = "forward_kl", beta: float = 0.5,
               temperature: float = 1.0) -> Divergence:
    """The divergence of `loss` (forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher);
    jsd: generalized Jensen-Shannon with `beta`) between the student and the teacher over the teacher's
    top-k tokens plus the rest bucket, averaged over the completion positions.

    `student_logits` [B, T, V]; `teacher_logprobs` [B, T, k] (already at `temperature`) and
    `teacher_ids` [B, T, k]; `labels` [B, T] with -100 where no loss is taken. The student's logits are
    divided by `temperature` before the softmax. Only the student's logits get gradients.
    """
    mask = completion_mask(labels)
    count = int(mask.sum())
    logits = student_logits[mask].float() / temperature  # [N, V]
    t_logp = teacher_logprobs[mask].detach().float()  # [N, k]
    ids = teacher_ids[mask].long()
    if count == 0:
        zero = student_logits.sum() * 0.0
        return Divergence(zero, zero.detach(), 0)
    total = torch.logsumexp(logits, dim=-1)  # [N]
    s_logp = logits.gather(-1, ids) - total.unsqueeze(-1)  # [N, k]
    # The student's rest: the logsumexp of the tokens outside the teacher's k (exact, no 1 - sum rounding).
    rest = torch.logsumexp(logits.scatter(-1, ids, float("-inf")), dim=-1) - total
    student = _with_rest(s_logp, rest)
    t_mass = t_logp.exp().sum(-1)
    teacher = _with_rest(t_logp, torch.log((1 - t_mass).clamp_min(_FLOOR)))
    if loss == "forward_kl":
        per = _kl(teacher, student)
    elif loss == "reverse_kl":
        per = _kl(student, teacher)
    elif loss == "jsd":
        # GKD's generalized JSD as TRL's `GKDTrainer.generalized_jsd_loss` computes it: the mixture
        # M = beta * teacher + (1 - beta) * student, and beta * KL(teacher || M) + (1 - beta) * KL(student || M).
        b = torch.tensor(beta, dtype=student.dtype, device=student.device)
        mixture = torch.logsumexp(torch.stack([teacher + torch.log(b), student + torch.log1p(-b)]), dim=0)
        per = beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)
    else:
        raise ValueError(f"unknown divergence '{loss}' (forward_kl, reverse_kl or jsd)")
    return Divergence(per.mean(), t_mass.mean().detach(), count)


def completion_cross_entropy(student_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy on the labelled tokens (logits at t predict token t + 1)."""
    logits = student_logits[:, :-1].float()
    target = labels[:, 1:]
    if not bool((target != IGNORE).any()):
        return student_logits.sum() * 0.0
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                             ignore_index=IGNORE)
