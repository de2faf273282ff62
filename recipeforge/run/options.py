"""How `recipeforge train` was started, and how a launch that failed says so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchOptions:
    """How `recipeforge train` was started: what the launcher needs to start the same recipe again in
    each worker, and the process layout asked for on the command line."""

    recipe_path: str | None = None            # the recipe as given (workers load it again)
    overrides: tuple[str, ...] = ()
    nproc_per_node: int | None = None         # CPU processes per node (GPU runs: one per GPU)
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    dry_run: bool = False
    debug: bool = False
    verbose: bool = False                     # library warnings on the console (the workers' too)
    trust_code: bool = False                  # --trust-code: the workers get it on their command line
    strict: bool = False                      # a locked recipe: refuse (not warn) when the environment differs
    ray: bool = False                         # `launch --ray`: start the workers on a Ray cluster (as
                                              # distributed.launcher: ray)
    ray_address: str | None = None            # `launch --ray --ray-address`: over the recipe's and RAY_ADDRESS


class LaunchFailed(Exception):
    """The launcher (and so a worker) exited with an error; the workers printed why."""

    def __init__(self, code: int):
        super().__init__(f"the launcher exited with code {code} (the workers' messages are above)")
        self.code = code
