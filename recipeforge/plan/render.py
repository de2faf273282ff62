"""`render_plan`: the readable table `recipeforge plan` prints."""

from __future__ import annotations

from recipeforge.credentials import redact_credentials
from recipeforge.plan.memory import COMPONENTS
from recipeforge.plan.models import human_count
from recipeforge.plan.types import Plan
from recipeforge.plan.vision_report import vision_lines

_LABELS = {
    "weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
    "adapter": "LoRA adapter (w+g+opt)",
    "reference_model": "reference model", "teacher_model": "teacher weights (whole on each GPU)",
    "teacher_topk": "teacher top-k targets", "teacher_forward": "teacher forward (no gradients)",
    "comm_buffers": "communication buffers", "rollout_engine": "rollout engine",
    "runtime": "CUDA/NCCL runtime", "activations": "activations", "vision_activations": "vision activations", "logits": "logits + loss",
    "gathered_params": "gathered/dequantized weights", "optimizer_step": "optimizer step temporaries",
    "kv_cache": "generation KV cache", "generation_params": "weights gathered to generate",
    "output_gradient": "output-layer gradient", "layer_gradient": "layer weight gradient (in backward)",
    "paged_optimizer": "paged optimizer states (step only)",
    "in_backward_step": "optimizer step in backward (one parameter)",
    "quantized_load": "quantized base load (loading only)",
    "allocator_reserve": "allocator reserve",
}


def render_plan(plan: Plan) -> str:
    """A plain-text report: the choice, sizes, batch split, memory per GPU by component, every
    decision with its reason (with `plan.trust.annotate_plan`: whether the recipe may import code, and
    why), the plugin components used, the runners-up and warnings."""
    lines: list[str] = _head_lines(plan)
    lines.append("")
    lines.append(_layout_table(plan))
    lines.append("")
    lines.extend(_memory_lines(plan))
    lines.append("")
    lines.extend(_decision_lines(plan))
    lines.extend(_plugin_lines(plan))
    lines.extend(_runner_lines(plan))
    lines.extend(_warning_lines(plan))
    # Names and reasons may quote recipe values (a model id, a server URL): never with a password.
    return redact_credentials("\n".join(lines))


def _head_lines(plan: Plan) -> list[str]:
    """The backend on its hardware, the model and its size, the precision and the compute per step."""
    x = plan.extra
    model = x.model
    lines: list[str] = []
    where = x.hardware.get("spec", plan.device)
    preset = f" ({plan.preset})" if plan.preset else ""
    if not plan.traits.preset_names_sizes and (plan.tensor_parallel > 1 or x.context_parallel > 1):
        preset += " with " + " x ".join(f"{name} parallel {n}" for name, n in
                                        (("tensor", plan.tensor_parallel), ("context", x.context_parallel)) if n > 1)
    lines.append(f"Plan: {plan.backend}{preset} on {where}")
    if model:
        size = f"{human_count(model['params'])} params"
        if "active_params" in model:  # MoE: memory follows the total, compute the active count
            size = f"{human_count(model['params'])} total, {human_count(model['active_params'])} active"
        if "head" in model:
            size += f", {model['head']} head"
        lines.append(f"Model: {model.get('name')} ({model.get('model_type')}, {size}; "
                     f"trainable {human_count(model.get('trainable_params', 0))})")
    lines.append(f"Precision: {x.precision}")
    lines.extend(vision_lines(x.vision, x.sequence_len))
    compute = _compute_line(plan)
    if compute:
        lines.append(compute)
    return lines


def _layout_table(plan: Plan) -> str:
    """Processes, parallel sizes, the batch split and the backend's own rows."""
    x = plan.extra
    return _table([
        ("processes", f"{plan.world_size} ({plan.nodes} node(s) x {plan.gpus_per_node} GPU(s))" if plan.device == "cuda"
         else "1 (CPU)"),
        ("parallel", f"data {plan.data_parallel} x tensor {plan.tensor_parallel} x pipeline {plan.pipeline_parallel}"
                     + (f" x context {x.context_parallel}" if x.context_parallel > 1 else "")),
        ("batch", f"micro {plan.micro_batch_size} x accumulation {plan.gradient_accumulation} x data "
                  f"{plan.data_parallel} = global {plan.global_batch_size}"),
        ("sequence length", str(x.sequence_len or "")),
        ("gradient checkpointing", checkpointing_label(plan)),
        *plan.backend_part.rows(),
        ("offload", plan.offload),
    ])


def _memory_lines(plan: Plan) -> list[str]:
    """The memory table by component, its accuracy and the host RAM offload needs."""
    x = plan.extra
    lines: list[str] = []
    unit = "GPU" if plan.device == "cuda" else "process"
    lines.append(f"Memory per {unit} (GB = GiB; limit {x.memory_limit_gb:.1f}):")
    rows = [(_LABELS.get(k, k), f"{plan.memory_gb[k]:8.2f}") for k in COMPONENTS if plan.memory_gb.get(k)]
    rows.append(("peak", f"{plan.memory_gb.get('total', 0):8.2f}"))
    lines.append(_table(rows, indent="  "))
    teacher = ", teacher forward" if plan.memory_gb.get("teacher_forward") else ""
    lines.append(f"  peak = weights/states/buffers + max(forward-backward, optimizer step, generation{teacher}) "
                 "+ allocator reserve")
    accuracy = plan.reasons.get("memory_accuracy")
    if accuracy is not None:
        lines.append(f"  expected accuracy {accuracy.value}" + _sensitive(accuracy.reason))
    if x.cpu_memory_gb:
        lines.append(f"  host RAM per node for offloaded states: {x.cpu_memory_gb:.0f} GB")
    lines.extend(_phase_lines(plan))
    return lines


def _phase_lines(plan: Plan) -> list[str]:
    """The whole run's peaks (`plan.phases`): GPU and host GB per process and per node, by phase."""
    phases = plan.extra.phases
    if not phases:
        return []
    gpu = plan.device == "cuda"
    head = ("phase", "GPU/process", "GPU/node", "host/process", "host/node", "") if gpu else \
        ("phase", "host/process", "host/node", "")
    rows = [head]
    for p in phases:
        host = (f"{p['host_per_process_gb']:.2f}", f"{p['host_per_node_gb']:.2f}")
        gpu_cells = (f"{p['gpu_per_process_gb']:.2f}", f"{p['gpu_per_node_gb']:.2f}") if gpu else ()
        rows.append((p["phase"], *gpu_cells, *host, p["note"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    out = ["", "Peak by phase (GB; host includes the process itself, ±25%; rank 0's where it differs):"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + ("  " + r[-1] if r[-1] else "")
            for r in rows]
    return out


def _decision_lines(plan: Plan) -> list[str]:
    lines = ["Decisions:"]
    for name, choice in plan.reasons.items():
        if name == "memory_accuracy":
            continue  # printed under the memory table
        lines.append(f"  {name:<22} {_value(choice.value):<16} {choice.reason}")
    return lines


def _plugin_lines(plan: Plan) -> list[str]:
    plugins = plan.extra.plugins
    if not plugins:
        return []
    return ["", "Plugins used:",
            *(f"  {p['group']:<28} {p['name']:<24} {p['distribution']} {p.get('version') or ''}".rstrip()
              for p in plugins)]


def _runner_lines(plan: Plan) -> list[str]:
    runners = plan.extra.runners_up
    if not runners:
        return []
    lines = ["", "Runners-up:"]
    for r in runners:
        label = r.get("label") or (r["backend"] + (f" {r['preset']}" if r.get("preset") else ""))
        lines.append(f"  {label:<32} {r['memory_gb']:8.2f} GB  {r['why']}")
    return lines


def _warning_lines(plan: Plan) -> list[str]:
    warnings = plan.extra.warnings
    if not warnings:
        return []
    return ["", "Warnings:", *(f"  - {w}" for w in warnings)]


def _compute_line(plan: Plan) -> str:
    """Training FLOPs per optimizer step from the active parameters, and the least time a step takes
    at the GPUs' peak dense throughput (real runs reach a fraction of it: the MFU)."""
    x = plan.extra
    weights, per_position = x.model.get("train_flops_per_token"), x.model.get("attention_flops_per_position")
    if not weights or not x.sequence_len:
        return ""
    tokens = plan.global_batch_size * x.sequence_len
    # 6N: forward 2N, input gradients 2N, weight gradients 2N; frozen weights (adapters,
    # train.unfrozen_parameters) skip their weight gradients
    share = min(1.0, x.model.get("trainable_params", x.model["params"]) / x.model["params"])
    per_token = weights * (4 + 2 * share) / 6 + (per_position or 0) * x.sequence_len
    step = per_token * tokens
    active = " (active parameters)" if "active_params" in x.model else ""
    line = f"Compute: {per_token / 1e9:.1f} GFLOP per token{active}, {step / 1e15:.2f} PFLOP per step"
    peak = (x.hardware.get("accelerator") or {}).get("peak_tflops") or 0
    gpus = plan.nodes * plan.gpus_per_node
    if plan.device == "cuda" and peak and gpus:
        seconds = step / (gpus * peak * 1e12)
        line += (f"; at least {seconds:.2f} s per step at {gpus} x {peak:.0f} TFLOP/s peak "
                 f"(at most {tokens / seconds:,.0f} tokens/s; divide by the MFU you reach)")
    return line


def _sensitive(reason: str) -> str:
    """The levers part of the accuracy reason, as a follow-on clause."""
    marker = "most sensitive to: "
    return f"; {reason[reason.index(marker):]}" if marker in reason else ""


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _table(rows: list[tuple[str, str]], indent: str = "") -> str:
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{indent}{k:<{width}}  {v}" for k, v in rows)


def checkpointing_label(plan: Plan) -> str:
    """``off``, ``on``, ``selective`` or ``every 4th layer``."""
    if not plan.gradient_checkpointing:
        return "off"
    if plan.checkpoint_mode == "selective":
        return "selective"
    return f"every {plan.checkpoint_every}th layer" if plan.checkpoint_every > 1 else "on"
