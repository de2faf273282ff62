"""The distillation divergence over the teacher's top-k tokens plus the rest bucket."""

from __future__ import annotations

import pytest
import torch

from recipeforge.components.distill_loss import completion_cross_entropy, completion_mask, divergence

V, B, T = 11, 2, 6


def _teacher(logits: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    top = torch.log_softmax(logits / temperature, dim=-1).topk(k, dim=-1)
    return top.values, top.indices


def _labels() -> torch.Tensor:
    labels = torch.randint(0, V, (B, T))
    labels[:, :2] = -100  # the prompt
    labels[1, -1] = -100  # padding
    return labels


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("k", [1, 4, V])
def test_zero_when_the_student_is_the_teacher(loss, k):
    torch.manual_seed(0)
    logits = torch.randn(B, T, V)
    lp, ids = _teacher(logits, k, temperature=2.0)
    out = divergence(logits, lp, ids, _labels(), loss=loss, temperature=2.0)
    assert abs(out.loss.item()) < 1e-5
    assert 0 < out.teacher_mass.item() <= 1 + 1e-6


def test_full_vocabulary_matches_kl_by_hand():
    torch.manual_seed(1)
    student, teacher = torch.randn(B, T, V), torch.randn(B, T, V)
    labels = _labels()
    lp, ids = _teacher(teacher, V, temperature=1.5)
    p = torch.softmax(teacher / 1.5, -1)
    q = torch.softmax(student / 1.5, -1)
    forward = (p * (p.log() - q.log())).sum(-1)
    reverse = (q * (q.log() - p.log())).sum(-1)
    mask = completion_mask(labels)
    got_f = divergence(student, lp, ids, labels, loss="forward_kl", temperature=1.5)
    got_r = divergence(student, lp, ids, labels, loss="reverse_kl", temperature=1.5)
    assert got_f.positions == int(mask.sum()) == 4 + 3  # labels at 2..5 and 2..4: t = 1..4 and 1..3
    torch.testing.assert_close(got_f.loss, forward[mask].mean(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_r.loss, reverse[mask].mean(), atol=1e-5, rtol=1e-5)
    assert abs(got_f.teacher_mass.item() - 1) < 1e-5


def test_top_k_compares_k_tokens_and_the_rest_bucket():
    torch.manual_seed(2)
    student, teacher = torch.randn(1, 2, V), torch.randn(1, 2, V)
    labels = torch.tensor([[5, 3]])  # one position counts: t = 0 predicts token 1
    k = 3
    lp, ids = _teacher(teacher, k)
    p, q = torch.softmax(teacher[0, 0], -1), torch.softmax(student[0, 0], -1)
    top = ids[0, 0]
    rest = torch.ones(V, dtype=torch.bool)
    rest[top] = False
    pb = torch.cat([p[top], p[rest].sum().view(1)])
    qb = torch.cat([q[top], q[rest].sum().view(1)])
    got = divergence(student, lp, ids, labels, loss="forward_kl")
    torch.testing.assert_close(got.loss, (pb * (pb.log() - qb.log())).sum(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.teacher_mass, p[top].sum(), atol=1e-6, rtol=1e-6)


def test_jsd_is_symmetric_at_half():
    torch.manual_seed(3)
    a, b = torch.randn(B, T, V), torch.randn(B, T, V)
    labels = _labels()
    ab = divergence(a, *_teacher(b, V), labels, loss="jsd", beta=0.5)
    ba = divergence(b, *_teacher(a, V), labels, loss="jsd", beta=0.5)
    torch.testing.assert_close(ab.loss, ba.loss, atol=1e-5, rtol=1e-5)
    assert ab.loss.item() > 0
    # beta near 0 tends to KL(teacher || student) / beta-scaled terms vanish: JSD stays below log 2.
    assert ab.loss.item() < torch.log(torch.tensor(2.0)).item()


def test_jsd_matches_trl_convention():
    """beta * KL(teacher || M) + (1 - beta) * KL(student || M), M = beta * teacher + (1 - beta) * student."""
    torch.manual_seed(4)
    student, teacher = torch.randn(B, T, V), torch.randn(B, T, V)
    labels = _labels()
    beta = 0.3
    p, q = torch.softmax(teacher, -1), torch.softmax(student, -1)
    m = beta * p + (1 - beta) * q
    want = beta * (p * (p / m).log()).sum(-1) + (1 - beta) * (q * (q / m).log()).sum(-1)
    got = divergence(student, *_teacher(teacher, V), labels, loss="jsd", beta=beta)
    torch.testing.assert_close(got.loss, want[completion_mask(labels)].mean(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
def test_gradients_reach_the_student_only(loss):
    torch.manual_seed(5)
    student = torch.randn(B, T, V, requires_grad=True)
    teacher = torch.randn(B, T, V, requires_grad=True)
    lp, ids = _teacher(teacher, 4)
    divergence(student, lp, ids, _labels(), loss=loss).loss.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_masked_positions_are_ignored():
    torch.manual_seed(6)
    student, teacher = torch.randn(B, T, V), torch.randn(B, T, V)
    labels = _labels()
    lp, ids = _teacher(teacher, 4)
    base = divergence(student, lp, ids, labels)
    changed = student.clone()
    changed[:, 0] += 5 * torch.randn(B, V)  # position 0 predicts a prompt token: no loss there
    changed[1, -2] += 5 * torch.randn(V)  # predicts the padded last token
    changed[:, -1] += 5 * torch.randn(B, V)  # the last position predicts nothing
    torch.testing.assert_close(divergence(changed, lp, ids, labels).loss, base.loss)
    nothing = divergence(student, lp, ids, torch.full((B, T), -100))
    assert nothing.positions == 0 and nothing.loss.item() == 0


def test_cross_entropy_on_completion_tokens():
    torch.manual_seed(7)
    logits, labels = torch.randn(B, T, V), _labels()
    mask = completion_mask(labels)
    targets = labels[:, 1:][mask[:, :-1]]
    want = torch.nn.functional.cross_entropy(logits[mask], targets)
    torch.testing.assert_close(completion_cross_entropy(logits, labels), want)
