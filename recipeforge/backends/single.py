"""One process, no launcher: the stage trains in the process that runs `recipeforge train`."""

from __future__ import annotations

from recipeforge.backends.base import BackendSpec
from recipeforge.capabilities import BackendCapabilities
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.memory import Layout


class SingleBackend(BackendSpec):
    """The whole model on one device (a GPU, or the CPU)."""

    name = "single"
    capabilities = BackendCapabilities(
        name, "one process: a GPU, or the CPU", max_cpu_processes=1,
        why={"offload": "one process keeps its optimizer where its weights are",
             "cpu_processes": "it runs one process"})
    cpu_preference = 0  # the first choice on the CPU: nothing to launch
    reports_runtime = False  # nothing distributed to report

    def candidates(self, w, hw, dist, *, pinned: bool) -> list[Candidate]:
        if hw.num_gpus > 1 and not pinned:
            return []
        return [Candidate(Layout(self.name, None, nodes=1, gpus_per_node=1), 0, "the whole model on one GPU")]

    def cpu_candidate(self, dist) -> Candidate:
        return Candidate(Layout(self.name, None, nodes=1, gpus_per_node=0), 0, "one process on the CPU")

    def launcher(self, plan) -> str:
        return "none"
