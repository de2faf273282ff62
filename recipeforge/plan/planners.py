"""The backend planners one plan may choose from, handed to the planner by its caller.

The planner never looks a backend up by name: `make_plan` gets a `Planners` (the installed ones by
default, `Planners.installed()`), offers the recipe every layout their specs offer, and binds each
layout to the spec that offered it (`Layout.planner`), so sizing, traits and reasons ask that spec.
A caller that plans for a subset (a test, a tool comparing backends) passes its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.capabilities import BackendCapabilities
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.plan.backend_spec import Candidate, PlannerSpec
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.workload import Workload


class Planners(Mapping[str, "PlannerSpec"]):
    """Backend planner specs by name, in preference order (the built-ins first, then plugins')."""

    def __init__(self, specs: Mapping[str, "PlannerSpec"],
                 missing: Callable[[str], "PlannerSpec"] | None = None):
        self._specs = dict(specs)
        self._missing = missing

    @classmethod
    def installed(cls) -> "Planners":
        """Every backend that loads here: recipeforge's own and the installed plugins'. A name that
        is not among them gets the registry's own error (unknown, or the plugin that failed to load)."""
        from recipeforge.capabilities import backend_specs
        from recipeforge.registry import registry_for

        registry = registry_for("backends")
        return cls(backend_specs(), missing=lambda name: registry.get(name, key="distributed.backend"))

    def __getitem__(self, name: str) -> "PlannerSpec":
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def spec(self, name: str) -> "PlannerSpec":
        """The spec of backend `name`; an unknown one is a recipe error at `distributed.backend`."""
        if name in self._specs:
            return self._specs[name]
        if self._missing is not None:
            return self._missing(name)
        raise RecipeError(f"unknown backend '{name}'", key="distributed.backend",
                          hint=f"one of: {', '.join(self._specs)}")

    def capabilities(self, name: str) -> "BackendCapabilities":
        """The capability record of backend `name` (its spec's `capabilities`)."""
        from recipeforge.capabilities import spec_capabilities

        return spec_capabilities(name, self.spec(name))

    def all_capabilities(self) -> "dict[str, BackendCapabilities]":
        """The capability record of every backend here that declares one, by name."""
        from recipeforge.capabilities import BackendCapabilities

        return {name: spec.capabilities for name, spec in self._specs.items()
                if isinstance(getattr(spec, "capabilities", None), BackendCapabilities)}

    def only(self, name: str) -> "Planners":
        """These planners narrowed to backend `name` (a pinned backend)."""
        return Planners({name: self.spec(name)}, self._missing)

    def bind(self, layout: "Layout") -> "Layout":
        """`layout` sized with its backend's spec (a layout read back from a plan)."""
        return replace(layout, planner=self.spec(layout.backend))

    def offered(self, w: "Workload", hw: "Hardware", dist: "DistributedConfig | None", *,
                pinned: bool) -> list["Candidate"]:
        """Every layout these specs offer `w` on `hw`, each bound to its spec, in preference order."""
        out = [replace(c, layout=replace(c.layout, planner=spec))
               for spec in self._specs.values() for c in spec.candidates(w, hw, dist, pinned=pinned)]
        return sorted(out, key=lambda c: c.order)

    def cpu_candidate(self, name: str, dist: "DistributedConfig") -> "Candidate":
        """Backend `name`'s one-process CPU layout, bound to its spec."""
        spec = self.spec(name)
        c = spec.cpu_candidate(dist)
        return replace(c, layout=replace(c.layout, planner=spec))
