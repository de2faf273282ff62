"""Test-suite wide settings: offline hub access, skipping `gpu` tests without CUDA, the tiers (tests/tiers.py:
markers, time limits, counts per tier; tests/process_guard.py: the default tier starts no process), and the
`tiny` fixture (the tiny example recipes, trained in this process), handed out as a fixture rather than
imported so test modules need no package structure; every test directory can use it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tiers
from plugin_testing import only_plugins
from process_guard import pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401
from tiers import pytest_terminal_summary  # noqa: F401

# Tests never reach a model hub; fail fast instead of waiting on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Under pytest-xdist (`-n 2`), each worker and the processes its tests start share the cores with the other
# workers: one thread each, unless the environment says otherwise. torch's spinning threads on an
# oversubscribed machine cost twice the CPU time and more.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                   // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks the tiers add
def pytest_collection_modifyitems(config, items):
    tiers.pytest_collection_modifyitems(config, items)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)
    # Packages that a few tests need and the main environment leaves out (see the step that installs each).
    for mark, package, step in (("requires_mlflow", "mlflow", ".ci/mlflow"),):
        if not _installed(package):
            skip = pytest.mark.skip(reason=f"needs {package} ({step} installs it and runs these tests)")
            for item in items:
                if mark in item.keywords:
                    item.add_marker(skip)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "yaml" / "tiny"


class Tiny:
    """Load and train the tiny example recipes; read what the runs wrote."""

    recipes = TINY

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir

    def load(self, name: str, run_dir: Path, *overrides: str):
        from recipeforge.config import load_recipe

        path = name if str(name).endswith(".yaml") else TINY / f"{name}.yaml"
        return load_recipe(path, overrides=[f"output.dir={run_dir}", f"data.cache_dir={self.cache_dir}",
                                            "logging.progress_bar=false", *overrides])

    def train(self, name: str, run_dir: Path, *overrides: str, overwrite: bool = True) -> Path:
        from recipeforge.run import train

        return train(self.load(name, run_dir, *overrides), overwrite=overwrite)

    def launch(self, name: str, run_dir: Path, *overrides: str, nproc: int = 2) -> Path:
        """Train on `nproc` processes as `recipeforge train ... --nproc-per-node N` does, with its launching
        side (plan, tokenize, write the workers' spec, start the backend's launcher, read the outcome) run
        in this process: the launcher (accelerate / torchrun) and the workers are processes of their own,
        only the launching command's start (its imports) is saved. For tests of what the workers do
        (numerics, files written); a test of the command as typed runs it in a subprocess."""
        from recipeforge.run import LaunchOptions, train

        run = train(self.load(name, run_dir, *overrides), launch=LaunchOptions(nproc_per_node=nproc))
        assert run is not None
        return run

    @staticmethod
    def records(run_dir: Path, split: str | None = None) -> list[dict]:
        from recipeforge.outputs.metrics import read_metrics

        return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if split is None or r.get("split") == split]

    def values(self, run_dir: Path, key: str, split: str = "train") -> list[float]:
        return [r[key] for r in self.records(run_dir, split) if r.get(key) is not None]

    @staticmethod
    def files(path: Path) -> set[str]:
        """Relative paths of the plain files below `path`."""
        return {str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file()}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("tokenized-cache"))


@pytest.fixture
def builtins_only():
    """recipeforge's registries without the plugins installed in this environment, for a test whose result
    depends on which plugins exist (e.g. a first-party plugin named before it is installed)."""
    with only_plugins():
        yield
