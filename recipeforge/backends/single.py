"""One process, no launcher: the stage trains in the process that runs `recipeforge train`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.backends.base import BackendSpec
from recipeforge.capabilities import BackendCapabilities
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.memory import Layout

if TYPE_CHECKING:
    from recipeforge.config.schema import DistributedConfig
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.types import Plan
    from recipeforge.plan.workload import Workload


class SingleBackend(BackendSpec):
    """The whole model on one device (a GPU, or the CPU)."""

    name = "single"
    capabilities = BackendCapabilities(
        name, "one process: a GPU, or the CPU", max_cpu_processes=1,
        why={"offload": "one process keeps its optimizer where its weights are",
             "cpu_processes": "it runs one process"})
    cpu_preference = 0  # the first choice on the CPU: nothing to launch
    reports_runtime = False  # nothing distributed to report

    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        if hw.num_gpus > 1 and not pinned:
            return []
        return [Candidate(Layout(self.name, None, nodes=1, gpus_per_node=1), 0, "the whole model on one GPU")]

    def cpu_candidate(self, dist: DistributedConfig) -> Candidate:
        return Candidate(Layout(self.name, None, nodes=1, gpus_per_node=0), 0, "one process on the CPU")

    def launcher(self, plan: Plan) -> str:
        return "none"
