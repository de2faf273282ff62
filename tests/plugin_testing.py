"""An isolated set of plugins for the tests whose result depends on which plugins exist.

`only_plugins(*roots)` hides from recipeforge's registries every plugin installed in this environment
(recipeforge-liger, -vllm, -zero-redundancy, a user's own...): they see the entry points of the
distributions under `roots` only. `distributions(tmp_path)` writes real distributions there (a `.dist-info`
with METADATA and entry_points.txt, next to their modules) and puts them on sys.path, so importlib.metadata
finds their entry points exactly as it finds pip-installed ones. Other entry-point groups (pytest's,
transformers') are left alone."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import warnings
from pathlib import Path


class Distributions:
    """Writes distributions into a directory that is on sys.path for the test."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: list[str] = []

    def add(self, name: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str] | None = None,
            version: str = "1.0") -> None:
        """A distribution `name` publishing `entry_points` ({group: {name: value}}) and shipping
        `modules` ({"pkg/mod.py": source})."""
        from recipeforge.registry import refresh_entry_points

        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in entry_points.items()))
        for rel, source in (modules or {}).items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
            self.modules.append(rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))
        refresh_entry_points()


@contextlib.contextmanager
def only_plugins(*roots: Path):
    """recipeforge's registries see the plugins under `roots` only (none: the built-ins alone) while the
    block runs; they read the environment's entry points again after it."""
    from importlib import metadata

    from recipeforge.registry import refresh_entry_points

    installed = metadata.entry_points
    allowed = [Path(r).resolve() for r in roots]

    def visible(ep) -> bool:
        if ep.dist is None:
            return False
        where = Path(str(ep.dist.locate_file(""))).resolve()
        return any(where == root or where.is_relative_to(root) for root in allowed)

    def entry_points(**params):
        found = installed(**params)
        group = params.get("group")
        if group is not None and group.startswith("recipeforge."):
            return metadata.EntryPoints(ep for ep in found if visible(ep))
        if group is None and not params:
            # Python < 3.12 gives the groups as a dict of EntryPoints here (what fsspec reads on import)
            with warnings.catch_warnings():  # its dict interface is deprecated; fsspec still reads it
                warnings.simplefilter("ignore", DeprecationWarning)
                every = list(found.values()) if isinstance(found, dict) else [found]
            return metadata.EntryPoints(ep for eps in every for ep in eps
                                        if not ep.group.startswith("recipeforge.") or visible(ep))
        return found

    metadata.entry_points = entry_points
    refresh_entry_points()
    try:
        yield
    finally:
        metadata.entry_points = installed
        refresh_entry_points()


@contextlib.contextmanager
def distributions(tmp_path: Path):
    """`dists.add(...)` installs a distribution for this block only, and the registries see no other
    plugin meanwhile; they forget it after."""
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    d = Distributions(root)
    try:
        with only_plugins(root):
            yield d
    finally:
        sys.path.remove(str(root))
        for name in d.modules:
            sys.modules.pop(name, None)


# A site directory holding the test-only distribution `rf-smooth-lm`, whose `recipeforge.stages` entry point
# adds the stage `smooth_lm` (tests/fixtures/stage_plugin/README.md). It is on no path unless a test puts it there.
STAGE_PLUGIN = Path(__file__).resolve().parent / "fixtures" / "stage_plugin"


@contextlib.contextmanager
def stage_plugin():
    """The `smooth_lm` stage plugin installed for this block only (no other plugin is seen meanwhile)."""
    sys.path.insert(0, str(STAGE_PLUGIN))
    try:
        with only_plugins(STAGE_PLUGIN):
            yield STAGE_PLUGIN
    finally:
        sys.path.remove(str(STAGE_PLUGIN))
        for name in [m for m in sys.modules if m == "rf_smooth_lm" or m.startswith("rf_smooth_lm.")]:
            sys.modules.pop(name)
