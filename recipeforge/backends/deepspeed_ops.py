"""Build DeepSpeed's just-in-time extensions for this machine before a run needs them.

DeepSpeed compiles its CPU Adam (optimizer offload) and, on a CPU, its shared-memory collectives the first
time a process asks for them: about a minute each on two cores, cached afterwards in the folder recipeforge
gives it (``~/.cache/recipeforge/torch_extensions``, or ``$TORCH_EXTENSIONS_DIR``). The ranks of a run that
find no build wait on a lock file while one of them compiles; building once beforehand (an image, a node's
first boot, a CI job) takes that minute out of every run's start::

    python -m recipeforge.backends.deepspeed_ops

Exits 2 with a hint when DeepSpeed is not installed.
"""

from __future__ import annotations

import os
import sys
import time

# CPU Adam serves optimizer offload on every accelerator; the shared-memory all-reduce only CPU runs.
ALWAYS = ("CPUAdamBuilder",)
CPU_ONLY = ("ShareMemCommBuilder",)


def build_all() -> list[tuple[str, float]]:
    """Build (or find built) the extensions a run on this machine's accelerator may load; return each
    extension's name and the seconds it took."""
    from recipeforge.backends.deepspeed import extensions_dir

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    names = ALWAYS + (CPU_ONLY if accelerator.device_name() == "cpu" else ())
    built = []
    for name in names:
        builder = accelerator.create_op_builder(name)
        if builder is None or not builder.is_compatible():
            continue
        start = time.perf_counter()
        builder.load()
        built.append((builder.name, time.perf_counter() - start))
    return built


def main() -> int:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("error: DeepSpeed is not installed\nhint: pip install 'recipeforge[deepspeed]'", file=sys.stderr)
        return 2
    for name, seconds in build_all():
        print(f"{name}: ready in {seconds:.1f}s ({os.environ['TORCH_EXTENSIONS_DIR']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
