"""The one door to Megatron-Bridge: its `AutoBridge`, imported when first asked for, or an error naming the
extra that installs it. The conversion (megatron_convert) and the weights (megatron_weights) modules both
go through it, so neither imports the other for it."""

from __future__ import annotations

from typing import Any

from recipeforge.errors import RecipeError

EXTRA_HINT = ("pip install 'recipeforge[megatron]' (Megatron-Bridge 0.6 needs Python 3.12 and Transformer Engine; "
              "training needs CUDA; .ci/megatron builds such an environment), or use another backend")


def auto_bridge() -> Any:
    """Megatron-Bridge's `AutoBridge`, or an error naming the extra that installs it."""
    try:
        from megatron.bridge import AutoBridge
    except ImportError as exc:
        raise RecipeError(f"the megatron backend needs Megatron-Bridge, which cannot be imported ({exc})",
                          key="distributed.backend", hint=EXTRA_HINT) from None
    return AutoBridge
