"""Mixture-of-experts models at training time: find the MoE layers, set how their experts run and
the load-balancing loss, freeze or train the routers, aim LoRA at the experts, and count the tokens
each expert receives.

transformers 5 stores a layer's routed experts as one module holding fused 3-D weights
(``experts.gate_up_proj`` of shape (experts, 2 x width, hidden) and ``experts.down_proj``), whose
forward takes ``(hidden_states, top_k_index, top_k_weights)``
(`transformers.integrations.moe.use_experts_implementation`), next to a router module (``gate``, or
``router`` in some models) holding a plain weight. Both are found by that shape, not by class name, so
every MoE architecture written that way is handled alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    import torch

# The recipe's `moe:` section (`config.schema.moe.MoEConfig`); components read it by attribute and do
# not import the config layer.
MoEConfig = Any

EXPERT_PARAMETERS = ("gate_up_proj", "down_proj", "up_proj")  # fused 3-D expert weights (up_proj: ungated)
ROUTER_NAMES = ("gate", "router")


@dataclass(frozen=True)
class MoELayer:
    """One MoE block: its module name, the experts module and the router module."""

    name: str
    experts: Any
    router: Any


def moe_layers(model: Any) -> list[MoELayer]:
    """The MoE blocks of `model` (empty for a dense model), in module order."""
    layers = []
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        if experts is None or not _is_fused_experts(experts):
            continue
        router = next((getattr(module, r) for r in ROUTER_NAMES if getattr(module, r, None) is not None), None)
        if router is not None:
            layers.append(MoELayer(name, experts, router))
    return layers


def _is_fused_experts(module: Any) -> bool:
    params = dict(module.named_parameters(recurse=False))
    return any(p in params and params[p].dim() == 3 for p in EXPERT_PARAMETERS) or _wrapped_experts(module)


def _wrapped_experts(module: Any) -> bool:
    # peft's ParamWrapper nests the experts module as `base_layer` (once per targeted parameter).
    inner = getattr(module, "base_layer", None)
    return inner is not None and _is_fused_experts(inner)


def base_experts(module: Any) -> Any:
    """The model's own experts module under any peft wrappers."""
    while getattr(module, "base_layer", None) is not None:
        module = module.base_layer
    return module


def configure(model: Any, moe: MoEConfig, *, location: Location | None = None) -> str:
    """Set the experts implementation and the load-balancing loss on `model` (before adapters wrap it);
    returns the experts implementation that runs."""
    config = model.config
    config.output_router_logits = bool(moe.aux_loss)
    if moe.aux_loss_coef is not None:
        config.router_aux_loss_coef = float(moe.aux_loss_coef)
        # The causal-LM head copies the coefficient at construction.
        if hasattr(model, "router_aux_loss_coef"):
            model.router_aux_loss_coef = float(moe.aux_loss_coef)
    if moe.experts_implementation != "auto":
        try:
            model.set_experts_implementation(moe.experts_implementation)
        except (ValueError, KeyError) as exc:
            raise RecipeError(f"moe.experts_implementation: {type(model).__name__} cannot run "
                              f"'{moe.experts_implementation}' ({exc})", key="moe.experts_implementation",
                              location=location, hint="use experts_implementation: auto") from None
    return str(getattr(config, "_experts_implementation", None) or "eager")


def set_router_trainable(model: Any, trainable: bool) -> int:
    """Freeze (or unfreeze) every router weight; returns how many router parameters there are."""
    count = 0
    for layer in moe_layers(model):
        for param in layer.router.parameters():
            param.requires_grad_(trainable)
            count += param.numel()
    return count


def router_modules(model: Any) -> list[str]:
    """Full module names of the routers (for peft `modules_to_save` / `exclude_modules`)."""
    return [f"{layer.name}.{_child_name(layer.router, layer.name, model)}" if layer.name else
            _child_name(layer.router, "", model) for layer in moe_layers(model)]


def _child_name(router: Any, parent: str, model: Any) -> str:
    block = model.get_submodule(parent) if parent else model
    return str(next(n for n, m in block.named_children() if m is router))


@dataclass(frozen=True)
class LoraPlan:
    """What LoRA adds on an MoE model: the expert parameters it targets (peft `target_parameters`),
    the routers it must not touch (`exclude_modules`) and the ones trained in full (`modules_to_save`)."""

    target_parameters: list[str] = field(default_factory=list)
    exclude_modules: list[str] = field(default_factory=list)
    modules_to_save: list[str] = field(default_factory=list)
    target_modules: list[str] | None = None  # `all-linear` resolved to full names, routers left out


def lora_plan(model: Any, moe: MoEConfig, *, dropout: float, target_modules: Any = "all-linear",
              location: Location | None = None) -> LoraPlan | None:
    """The MoE part of a LoRA config for `model`, or None for a dense model. The routers never get
    low-rank adapters: they stay frozen, or with `moe.train_router` train in full and are saved with
    the adapter.

    peft 0.21 rewrites a string `target_modules` of a Mixtral / Qwen-MoE model as transformers 4 named
    it (`peft.utils.transformers_weight_conversion`): `all-linear` then also puts LoRA on every router
    (`gate.weight`) and on the experts at twice the rank. `all-linear` is therefore resolved here to the
    full names of the model's linear layers (the output layer and the routers left out), and the
    experts are targeted only through `target_parameters`."""
    layers = moe_layers(model)
    if not layers:
        return None
    routers = router_modules(model)
    targets: list[str] = []
    if experts_adapted(moe, dropout):
        if dropout:
            raise RecipeError(f"LoRA on the routed experts (peft target_parameters) takes no dropout, and "
                              f"adapter.dropout is {dropout}", key="adapter.dropout", location=location,
                              hint="set adapter.dropout: 0, or moe.lora_experts: false (LoRA on attention only)")
        inner = dict(base_experts(layers[0].experts).named_parameters(recurse=False))
        targets = [f"experts.{p}" for p in EXPERT_PARAMETERS if p in inner and inner[p].dim() == 3]
    exclude = [f"^{re.escape(r)}$" for r in routers]
    resolved = _linear_names(model, set(routers)) if target_modules == "all-linear" else None
    return LoraPlan(target_parameters=targets, exclude_modules=[] if not exclude else ["|".join(exclude)],
                    modules_to_save=routers if moe.train_router else [], target_modules=resolved)


def _linear_names(model: Any, routers: set[str]) -> list[str]:
    import torch

    output = model.get_output_embeddings()
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not output and name not in routers]


def check_lora_layout(model: Any, plan: LoraPlan) -> None:
    """After peft wrapped `model`: no router carries a low-rank adapter (a frozen router must stay
    exactly as loaded; a trained one trains in full). Raises if peft put one there anyway."""
    routers = [layer.router for layer in moe_layers(model)]
    adapted = [type(r).__name__ for r in routers if hasattr(r, "lora_A") or hasattr(getattr(r, "base_layer", None),
                                                                                  "lora_A")]
    if adapted:
        raise RecipeError(f"peft put LoRA adapters on {len(adapted)} router(s) ({adapted[0]}); the routers must "
                          "stay frozen or train in full", key="adapter.target_modules",
                          hint="name the modules to adapt in adapter.target_modules (e.g. [q_proj, k_proj, "
                               "v_proj, o_proj]) without the router (`gate`)")


def experts_adapted(moe: MoEConfig, dropout: float) -> bool:
    """Whether LoRA reaches the routed experts: `moe.lora_experts`, or when unset, whether the adapter
    has no dropout (peft's expert adapters take none)."""
    return bool(moe.lora_experts) if moe.lora_experts is not None else not dropout


def global_experts(experts: Any) -> int:
    """The routed experts of a layer, all ranks together: under expert parallel the module's
    `num_experts` is this rank's share, while its fused weights (DTensors) keep the global shape."""
    weights = [p for p in experts.parameters(recurse=False) if p.dim() == 3]
    if weights:
        return int(weights[0].shape[0])
    return int(getattr(experts, "num_experts", 0))


class ExpertLoad:
    """Tokens routed to each expert of each MoE layer, and the auxiliary loss, between two logs.

    Forward pre-hooks on the experts modules read the router's choice (`top_k_index`); a forward hook
    on the model reads its `aux_loss`. `take()` is a metrics source: it returns the counts and the mean
    auxiliary loss since the last call and starts over."""

    def __init__(self, model: Any, *, count_load: bool = True):
        self.layers = moe_layers(model)
        self.counts: list[torch.Tensor | None] = [None] * len(self.layers)
        self.aux: list[float] = []
        self.handles: list[Any] = []
        if count_load:
            for i, layer in enumerate(self.layers):
                self.handles.append(base_experts(layer.experts).register_forward_pre_hook(
                    self._counter(i, base_experts(layer.experts)), with_kwargs=True))
        self.handles.append(model.register_forward_hook(self._aux))

    def _counter(self, index: int, experts: Any) -> Callable[..., None]:
        import torch

        num = global_experts(experts)

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # Gradient checkpointing runs the layer's forward again inside backward: count it once.
            if not module.training or torch._C._current_graph_task_id() != -1:
                return
            top_k = args[1] if len(args) > 1 else kwargs.get("top_k_index")
            if top_k is None:
                return
            ids = top_k.detach().reshape(-1)
            ids = ids[(ids >= 0) & (ids < num)]  # padding slots (-1) are no expert
            counts = torch.bincount(ids, minlength=num).cpu()
            seen = self.counts[index]
            self.counts[index] = counts if seen is None else seen + counts

        return hook

    def _aux(self, module: Any, args: Any, output: Any) -> None:
        aux = getattr(output, "aux_loss", None)
        if aux is not None and module.training:
            self.aux.append(float(aux.detach()))

    def take(self) -> dict[str, Any]:
        """The records since the last call: `moe/aux_loss`, `moe/expert_load` (per layer, tokens per
        expert) and `moe/load_imbalance` (the busiest expert's load over the mean, worst layer)."""
        out: dict[str, Any] = {}
        if self.aux:
            out["moe/aux_loss"] = round(sum(self.aux) / len(self.aux), 6)
        loads = [c.tolist() for c in self.counts if c is not None]
        if loads:
            out["moe/expert_load"] = loads
            ratios = [max(load) * len(load) / sum(load) for load in loads if sum(load)]
            if ratios:
                out["moe/load_imbalance"] = round(max(ratios), 4)
        self.aux = []
        self.counts = [None] * len(self.layers)
        return out

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
