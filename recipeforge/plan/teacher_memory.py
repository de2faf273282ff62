"""A distillation teacher's bytes on each training GPU and its lines in the plan (`plan.teacher`
says what the teacher is and where its shape comes from; docs/planner.md, "Distillation teacher")."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from recipeforge.credentials import redact_credentials
from recipeforge.plan.linear import quantized_bytes_per_param
from recipeforge.plan.models import ModelSpec, human_count
from recipeforge.plan.teacher import Teacher
from recipeforge.plan.workload import Workload

TOPK_BYTES = 4 + 8 + 4  # per kept token: the teacher's fp32 log-prob, its int64 id, the student's fp32 log-prob there
REST_BYTES = 4          # per position: the fp32 log-probability of the rest of the vocabulary (one bucket)
DOUBLE_QUANT = True     # NF4 as recipeforge's QLoRA loads it by default (`adapter.quant.double_quant`)


# ----------------------------------------------------------------------------- bytes per GPU

def teacher_weight_bytes(t: Teacher, compute_bytes: float) -> float:
    """A colocated teacher's weights on each GPU: every parameter in the compute dtype, or with
    `load_in_4bit` its quantized linears as NF4 (0.5 bytes plus the blocks' absmax constants,
    `linear.quantized_bytes_per_param`) and the rest (embeddings, norms, output layer) in the compute dtype."""
    if not t.colocated or t.model is None:
        return 0.0
    m = t.model
    if not t.load_in_4bit:
        return m.total_params() * compute_bytes
    q = m.quantized_params()
    return q * quantized_bytes_per_param(4, DOUBLE_QUANT, m.hidden_size) + (m.total_params() - q) * compute_bytes


def layer_forward_bytes_per_token(w: Workload, m: ModelSpec) -> float:
    """The teacher's largest decoder-layer moment per token without gradients (nothing is kept for
    a backward): the residual input, the normed tensor with its fp32 upcast, and then either
    attention's q, k, v and output (eager attention: its scores per head too) or the MLP's
    intermediates (gated: gate, up and their product; an MoE layer also its tokens' routed copies)."""
    c, h = w.compute_bytes, m.hidden_size
    base = c * h + 4 * h + c * h
    attention = c * (2 * m.q_dim + 2 * m.kv_dim)
    if w.attention == "eager":
        attention += (4 + c) * m.num_heads * w.seq_len
    mlp = c * m.mlp_width * (3 if m.gated_mlp else 2) + (c * h * m.experts_per_token if m.is_moe else 0)
    return base + max(attention, mlp)


def logits_bytes_per_token(w: Workload, m: ModelSpec) -> float:
    """The teacher's full-vocabulary logits per token in the compute dtype, plus their fp32 log-softmax."""
    return m.vocab_size * (w.compute_bytes + 4)


def topk_bytes(w: Workload, micro_batch: int) -> float:
    """The top-k targets of one micro batch (`TOPK_BYTES` per kept token, the rest bucket per position)."""
    t = w.teacher
    if t is None or not t.colocated:
        return 0.0
    return micro_batch * w.seq_len * (t.top_k * TOPK_BYTES + REST_BYTES)


def forward_bytes(w: Workload, micro_batch: int) -> float:
    """What the teacher's forward of one micro batch holds at its peak besides the top-k: one layer's
    working tensors and the logits with their log-softmax; a 4-bit teacher also one linear
    dequantized to the compute dtype at a time."""
    t = w.teacher
    if t is None or not t.colocated or t.model is None:
        return 0.0
    m = t.model
    tokens = micro_batch * w.seq_len
    dequantized = m.largest_linear_params() * w.compute_bytes if t.load_in_4bit else 0.0
    return tokens * (layer_forward_bytes_per_token(w, m) + logits_bytes_per_token(w, m)) + dequantized


def book_teacher(w: Workload, part: dict[str, float], micro_batch: int) -> None:
    """Book a colocated teacher into `part` (a `memory.estimate` component table): its weights
    (persistent), its forward (a phase of its own) and the top-k (alive through the train phase)."""
    if w.teacher is None or not w.teacher.colocated:
        return
    part["teacher_model"] = teacher_weight_bytes(w.teacher, w.compute_bytes)
    part["teacher_forward"] = forward_bytes(w, micro_batch)
    part["teacher_topk"] = topk_bytes(w, micro_batch)


# ----------------------------------------------------------------------------- the plan's report

def teacher_summary(w: Workload, memory_gb: dict[str, float]) -> dict[str, Any]:
    """The teacher for plan.json (`PlanExtras.teacher`; empty for other stages)."""
    t = w.teacher
    if t is None:
        return {}
    if not t.colocated:
        return {"colocated": False, "url": redact_credentials(t.name), "per_gpu_gb": 0.0}
    assert t.model is not None
    weights, forward, topk = (memory_gb.get(k, 0.0) for k in ("teacher_model", "teacher_forward", "teacher_topk"))
    return {"colocated": True, "name_or_path": t.name, "source": t.source, "model_type": t.model.model_type,
            "params": t.model.total_params(), "vocab_size": t.model.vocab_size,
            "precision": "4-bit NF4" if t.load_in_4bit else w.dtype, "top_k": t.top_k,
            "weights_gb": weights, "forward_gb": forward, "topk_gb": topk,
            "per_gpu_gb": round(weights + forward + topk, 2)}


def teacher_reason(w: Workload, memory_gb: dict[str, float], micro_batch: int) -> tuple[Any, str] | None:
    """(value, reason) of the plan's `teacher` decision: what it costs each GPU and why."""
    t = w.teacher
    if t is None:
        return None
    if not t.colocated:
        return "served", (f"distill.teacher.url {redact_credentials(t.name)}: the teacher runs on its own server and "
                          f"returns its top-{t.top_k} log-probs; nothing of it is held on the training GPUs (0 GB per GPU)")
    assert t.model is not None
    summary = teacher_summary(w, memory_gb)
    weights = (f"4-bit NF4 linears with their quantization constants, the rest in {w.dtype}" if t.load_in_4bit
               else f"in {w.dtype}, the student's compute dtype")
    reason = (f"colocated {t.name} ({human_count(t.model.total_params())} params, counted from {t.source}): "
              f"frozen and whole on every GPU (replicated, not sharded), weights {summary['weights_gb']:.2f} GB "
              f"{weights}; before the student's forward it scores the micro batch of {micro_batch} without gradients: "
              f"one layer and its [{micro_batch}, {w.seq_len}, {t.model.vocab_size}] logits in {w.dtype} with their "
              f"fp32 log_softmax, {summary['forward_gb']:.2f} GB at its peak; its top-{t.top_k} targets "
              f"({_size(topk_bytes(w, micro_batch))}) stay alive through the student's step")
    return f"{summary['per_gpu_gb']:.2f} GB/GPU", reason


def _size(amount: float) -> str:
    """Bytes as GB, or as MB below a tenth of a GB."""
    gib = 1024 ** 3
    return f"{amount / gib:.2f} GB" if amount >= 0.1 * gib else f"{amount / 1024 ** 2:.1f} MB"


def teacher_alternatives(w: Workload, fits: Callable[[Workload], tuple[str, float] | None]) -> list[str]:
    """What would fit instead of a colocated teacher that does not: `fits(workload)` returns the
    chosen layout's label and GB per GPU, or None."""
    t = w.teacher
    if t is None or not t.colocated:
        return []
    out: list[str] = []
    if not t.load_in_4bit:
        found = fits(dataclasses.replace(w, teacher=dataclasses.replace(t, load_in_4bit=True)))
        out.append("distill.teacher.load_in_4bit: true " + (f"fits ({found[0]}, {found[1]:.1f} GB per GPU)" if found
                                                           else "does not fit either"))
    found = fits(dataclasses.replace(w, teacher=dataclasses.replace(t, colocated=False, model=None)))
    if found:
        out.append(f"a served teacher (distill.teacher.url, e.g. `vllm serve {t.name}` on other GPUs) fits "
                   f"({found[0]}, {found[1]:.1f} GB per GPU)")
    return out
