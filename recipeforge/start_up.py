"""A process's start-up kept out of the garbage collector's way.

Importing torch, transformers, peft, datasets and what they pull in makes about 550k objects that live as
long as the process. While they are made, each of Python's full collections walks every object made so
far again: about 1.1 s of the 6.5 s a training process spends importing on a 2-core CPU, for nothing,
since none of them is garbage. A process that will train, tokenize or load a saved model pauses the collector from its first
line (`pause`); once the libraries it runs on are imported, it freezes every object that exists
(`gc.freeze`: never examined again, never collected) and turns the collector back on (`resume`), before it
reads its data or builds its model, so what those make is collected as usual.

Only the process's own entry pauses (the `recipeforge` command, the worker entry): `resume` does nothing
where `pause` was not called, e.g. in a program that calls recipeforge's functions.
"""

from __future__ import annotations

import gc
import importlib

# What a training process runs on, whatever its stage and backend (every runner subclasses a
# transformers Trainer), and what tokenizing the data runs on.
TRAINING = ("transformers.trainer", "datasets")
TOKENIZING = ("datasets", "transformers.tokenization_utils_fast")
# What loading a saved model for `eval`, `export` and `chat` runs on.
MODEL_LOADING = ("transformers.modeling_utils",)

_paused = False


def pause() -> None:
    """Turn the garbage collector off until `resume` (a no-op if it is off already)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(*modules: str) -> None:
    """Import `modules` (a missing one is left to the code that needs it to report), freeze every object
    made so far and turn the collector back on; nothing if `pause` did not turn it off."""
    global _paused
    if not _paused:
        return
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.freeze()
    gc.enable()
    _paused = False
