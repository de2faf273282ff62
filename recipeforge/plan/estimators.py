"""Closed-form model-state figures from the literature, as pure functions of parameter counts.

- `zero_model_states`: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", Sec. 3.1 and Fig. 1: with mixed-precision Adam every parameter costs
  2 bytes (16-bit weights) + 2 bytes (16-bit gradients) + K = 12 bytes (fp32 master weights, momentum
  and variance); stage 1 shards the K bytes over N_d data-parallel ranks, stage 2 also the gradients,
  stage 3 also the weights.
- `deepspeed_zero2_mem_needs` / `deepspeed_zero3_mem_needs`: DeepSpeed's
  ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
  (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, explained on DeepSpeed's "Memory
  Requirements" page), returning (cpu_bytes, gpu_bytes).

All results are in bytes.
"""

from __future__ import annotations


def zero_model_states(params: float, shards: int, stage: int, *, weight_bytes: float = 2.0,
                      grad_bytes: float = 2.0, optimizer_bytes: float = 12.0) -> tuple[float, float, float]:
    """Per-GPU (weights, gradients, optimizer states) bytes of ZeRO stage `stage` over `shards` ranks.

    Stage 0 is plain data parallelism; ``optimizer_bytes`` is the paper's K.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    n = max(1, shards)
    weights = params * weight_bytes / (n if stage >= 3 else 1)
    grads = params * grad_bytes / (n if stage >= 2 else 1)
    optimizer = params * optimizer_bytes / (n if stage >= 1 else 1)
    return weights, grads, optimizer


def deepspeed_zero2_mem_needs(params: float, gpus_per_node: int = 1, nodes: int = 1,
                              offload_optimizer: bool = True, buffer_factor: float = 1.5) -> tuple[int, int]:
    """DeepSpeed's ZeRO-2 model-state estimate: (CPU bytes, GPU bytes per GPU).

    GPU: 2 * params with the optimizer offloaded (16-bit weights only), else
    2 * params + 18 * params / world: 16-bit weights whole, and partitioned 16-bit gradients (2),
    fp32 gradients (4), fp32 master weights (4), momentum and variance (8). Earlier releases
    counted the 16-bit gradients whole (4 * params + 16 * params / world), which is what the ZeRO-2
    figures on DeepSpeed's "Memory Requirements" page show. CPU: the fp32 model built by the ranks at
    start-up, or the offloaded fp32 states, times the safety factor 1.5.
    """
    world = nodes * gpus_per_node
    if offload_optimizer:
        gpu = 2 * params
        cpu = params * max(4 * world, 16) * buffer_factor
    else:
        gpu = 2 * params + int(18 * params / world)
        cpu = params * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_mem_needs(params: float, largest_layer_params: float, gpus_per_node: int = 1, nodes: int = 1,
                              offload_optimizer: bool = True, offload_params: bool = True, zero_init: bool = True,
                              buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """DeepSpeed's ZeRO-3 model-state estimate: (CPU bytes per node, GPU bytes per GPU, largest-layer bytes).

    The largest module is gathered whole on each GPU with its 16-bit weights and gradients
    (4 * largest_layer_params). On top of that the GPU holds nothing else with everything offloaded,
    2 * params / world (16-bit weight shards) with only the optimizer offloaded, and 18 * params /
    world without offload (16-bit weights + fp32 master weights, gradients, momentum, variance).
    Offloaded states live in each node's RAM: 16 (optimizer) or 18 (optimizer + weights) bytes per
    parameter divided over the nodes; without zero.Init every rank first builds the fp32 model on CPU.
    """
    world = nodes * gpus_per_node
    layer = 4 * largest_layer_params
    startup = params * 4 * gpus_per_node  # every rank of a node materialises the fp32 model
    if offload_optimizer:
        per_param = 18 if offload_params else 16
        gpu = layer if offload_params else layer + int(2 * params / world)
        offloaded = params * per_param / nodes
        cpu = (offloaded if zero_init else max(startup, offloaded)) * buffer_factor
    else:
        gpu = layer + int(18 * params / world)
        cpu = (largest_layer_params * 4 * gpus_per_node if zero_init else startup) * buffer_factor
    return int(cpu), int(gpu), int(layer)
