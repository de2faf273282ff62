"""The peak of one forward and backward pass: which of its tensors are alive at the same time.

Activations, logits, autocast's weight copies, the output layer's gradient and gathered weights do
not all peak together. The forward pass ends with every activation, every autocast copy and the
loss's forward (16-bit logits, their fp32 copy, the fp32 log-softmax); the loss's backward holds the
12-byte log-softmax gradients instead, and autocast has dropped the copies that recomputed layers
do not keep; the output layer's backward has freed the logits but makes its weight gradient; each
layer's backward then starts with its (recomputed) activations and ends with its weight gradients.
`train_peak` evaluates each of these moments from what is alive in it and returns the largest, with
its parts named as `memory.TRAIN_PHASE` names them (docs/planner.md, "The train phase's peak").
"""

from __future__ import annotations

from dataclasses import dataclass

from recipeforge.plan.activations import Activations


@dataclass(frozen=True)
class Gathered:
    """Unsharded weights and gradients of a sharding engine at each moment of the step (bytes).

    FSDP2 moves them with the step; DeepSpeed's figures are the same in every moment (`constant`)."""

    forward: float = 0.0          # while the first layers are gathered in forward
    forward_end: float = 0.0      # while the loss is computed
    backward: float = 0.0         # the loss's and the output layer's backward
    layer: float = 0.0            # while the first layer of backward (the last one) runs backward
    layer_later: float = 0.0      # while a later one does (with the previous layer's reduce-scatter input)
    layer_gradients: float = 0.0  # that layer's unsharded gradients, complete when its backward ends
    root_end: float = 0.0         # the root's gradients at the end of backward (FSDP2: before its reduce-scatter)
    output_gradient: float = 0.0  # the output layer's unsharded gradient, from its backward to the end

    @classmethod
    def constant(cls, amount: float) -> "Gathered":
        """The same gathered bytes throughout (ZeRO-3's buffers, a dequantized QLoRA weight)."""
        return cls(forward=amount, forward_end=amount, backward=amount, layer=amount, layer_later=amount,
                   root_end=amount)

    def divided(self, n: int) -> "Gathered":
        """Every figure over `n` (tensor parallelism splits each weight and gradient)."""
        return Gathered(**{f: getattr(self, f) / n for f in self.__dataclass_fields__})

    def plus(self, amount: float) -> "Gathered":
        """These figures plus `amount` in every moment."""
        more = ("forward", "forward_end", "backward", "layer", "layer_later", "root_end")
        return Gathered(**{f: getattr(self, f) + (amount if f in more else 0.0) for f in self.__dataclass_fields__})


@dataclass(frozen=True)
class Copies:
    """16-bit copies of fp32 weights under autocast (bytes): all of them, the output layer's, one
    layer's, and the widest linear's of a layer.

    Autocast caches the cast of every weight until its region (the forward pass) ends; a layer
    that is not recomputed keeps its copies for backward, a recomputed one casts them again."""

    every: float = 0.0
    head: float = 0.0
    layer: float = 0.0
    widest: float = 0.0


@dataclass(frozen=True)
class LayerGradient:
    """A layer's widest weight gradient (bytes): as its matmul's backward makes it; while autocast
    casts it to the fp32 weight's dtype (its 16-bit form and the copy); and what of it stays for the
    rest of the layer's backward (FSDP2 keeps a layer's gradients unsharded until its reduce-scatter)."""

    made: float = 0.0
    cast: float = 0.0
    held: float = 0.0


@dataclass(frozen=True)
class Step:
    """What one micro batch's forward and backward hold, for `train_peak`: its activations, the
    logits as (forward, backward) from `activations.logits_phases`, autocast's copies, the output
    layer's weight gradient as its backward makes it where torch owns the gradients, a layer's
    widest weight gradient, and the engine's gathered weights and gradients."""

    act: Activations
    logits: tuple[float, float]
    checkpointing: bool
    copies: Copies = Copies()
    output_gradient: float = 0.0
    layer_gradient: LayerGradient = LayerGradient()
    gathered: Gathered = Gathered()
    idle_at_loss: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Moment:
    """One moment of the step: its name, the bytes alive in it by `memory.TRAIN_PHASE` part, and the
    bytes the caching allocator holds in it in free blocks too small for its requests (`idle`)."""

    name: str
    parts: dict[str, float]
    idle: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def train_peak(step: Step) -> Moment:
    """The largest moment of one micro batch's forward and backward."""
    return max(moments(step), key=lambda mo: mo.total)


def reserved_peak(step: Step) -> float:
    """What the caching allocator holds at the step's fullest moment: the moment's tensors and the
    free blocks it cannot use (`Step.idle_at_loss`). After the loss, the freed logits blocks are
    larger than every later request and are split to serve them: nothing idle is counted there."""
    return max(mo.total + mo.idle for mo in moments(step))


def moments(step: Step) -> list[Moment]:
    """Every moment `train_peak` compares, in the order the step passes them."""
    act, g, copies = step.act, step.gathered, step.copies
    kept = act.stored + act.outside
    # copies alive in backward: every layer's when no layer is recomputed, else none but the output layer's
    bwd_copies = copies.head if step.checkpointing else copies.every
    return [
        Moment("the first layers' forward", {"gathered_params": g.forward}),
        Moment("the end of the forward pass (the loss)",
               {"activations": kept, "logits": step.logits[0], "autocast_weights": copies.every,
                "gathered_params": g.forward_end}, step.idle_at_loss[0]),
        Moment("the loss's backward", {"activations": kept, "logits": step.logits[1], "autocast_weights": bwd_copies,
                                       "gathered_params": g.backward}, step.idle_at_loss[1]),
        Moment("the output layer's backward",
               {"activations": kept, "autocast_weights": bwd_copies - copies.head,
                "output_gradient": step.output_gradient + g.output_gradient, "gathered_params": g.backward}),
        # the last layer runs backward first; a later one has one layer's activations fewer (without
        # recomputation) and, under FSDP2, the previous layer's reduce-scatter input next to it
        *_layer_moments(step, "the last layer's backward", act.stored, g.layer),
        *_layer_moments(step, "the next layer's backward", act.stored - act.layer, g.layer_later),
        Moment("the end of backward", {"output_gradient": g.output_gradient, "gathered_params": g.root_end}),
    ]


def _layer_moments(step: Step, layer: str, stored: float, gathered: float) -> list[Moment]:
    """The moments of one decoder layer's backward, with `stored` activations of the other layers
    (and its own) and `gathered` unsharded bytes besides its gradients."""
    act, copies, grad = step.act, step.copies, step.layer_gradient
    own = stored + act.recomputed + act.incoming  # with the gradient reaching the layer
    copies_kept = copies.layer if step.checkpointing else copies.every - copies.head
    held = {"output_gradient": step.gathered.output_gradient}  # FSDP2's unsharded output-layer gradient
    return [
        Moment(f"{layer}, as it starts",
               {"activations": own + act.working, "autocast_weights": copies_kept, **held,
                "layer_gradient": grad.made, "gathered_params": gathered}),
        # the widest linear's backward has run: its saved input and weight copy are freed, its input
        # gradient (as large as that input) is alive, and autocast casts its weight gradient to fp32
        Moment(f"{layer}, its widest weight gradient cast to fp32",
               {"activations": own, "autocast_weights": copies_kept - copies.widest, **held,
                "layer_gradient": grad.cast, "gathered_params": gathered}),
        Moment(f"{layer}, the MLP's elementwise backward",
               {"activations": own + act.mlp_backward, "autocast_weights": copies_kept - copies.widest, **held,
                "layer_gradient": grad.held, "gathered_params": gathered}),
        Moment(f"{layer}, as it ends",
               {"activations": stored - act.layer + act.norm_backward,
                "autocast_weights": copies_kept - (0.0 if step.checkpointing else copies.layer), **held,
                "gathered_params": gathered + step.gathered.layer_gradients}),
    ]
