"""`distributed:` and `hardware:` — how to spread the run, and the machine it is planned for."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from recipeforge.config.schema.base import Section

from recipeforge.capabilities import LAUNCHERS, OFFLOAD_MODES, BackendName

# A built-in backend's name, `auto`, or a plugin backend's name (checked against the registry).
Backend = Annotated[str, Field(min_length=1, examples=["auto", *(b.value for b in BackendName)])]
# A parallel size the planner may choose (`auto`) or the recipe pins.
ParallelSize = Union[Literal["auto"], Annotated[int, Field(ge=1)]]
PARALLEL_SIZE_KEYS = ("tensor_parallel", "context_parallel", "data_parallel_replicate", "data_parallel_shard")


class DistributedConfig(Section):
    """The distributed backend; `auto` lets the planner choose and explain why."""

    backend: Backend = Field("auto", description=" | ".join(b.value for b in BackendName)
                             + ", a plugin backend's name, or `auto` (planner).")
    preset: Optional[str] = Field(
        None, description="A named backend preset (zero2, zero3_offload, fsdp_full_shard, ...); see `recipeforge plan`.")
    zero_stage: Union[Literal["auto"], Literal[0, 1, 2, 3]] = Field(
        "auto", description="DeepSpeed ZeRO stage; `auto` lets the planner choose.")
    offload: Literal[("auto", *OFFLOAD_MODES)] = Field(
        "auto", description="Offload optimizer states (and parameters) to CPU memory; `auto`: only when nothing "
                            "fits on the GPUs alone; `none` forbids it.")
    tensor_parallel: ParallelSize = Field(
        "auto", description="Tensor-parallel size: attention heads and MLP columns split over this many GPUs of a "
                            "node. FSDP2: the model's tensor-parallel plan (transformers' `base_model_tp_plan`, "
                            "loaded sharded) on an accelerate `ParallelismConfig` (`tp_size`); Megatron: "
                            "`tensor_model_parallel_size`. `auto`: the planner adds it when the model does not fit "
                            "per GPU otherwise.")
    pipeline_parallel: int = Field(1, ge=1, description="Pipeline-parallel size (Megatron).")
    context_parallel: ParallelSize = Field(
        "auto", description="Context-parallel size: each sequence split over this many GPUs (ring attention, "
                            "PyTorch context parallel through accelerate's `ParallelismConfig.cp_size`, FSDP2, "
                            "CUDA only). Needs `data.sequence_len` divisible by 2 x the size, sdpa attention and "
                            "no packing. `auto`: the planner adds it when a sequence's activations do not fit.")
    data_parallel_replicate: ParallelSize = Field(
        "auto", description="FSDP2 replicas (`ParallelismConfig.dp_replicate_size`): the model is sharded inside "
                            "a replica and replicated across them (hybrid sharding; usually the node count). "
                            "`auto`: 1, or the node count for fsdp_sharding: hybrid_shard.")
    data_parallel_shard: ParallelSize = Field(
        "auto", description="GPUs each FSDP2 replica shards the model over (`ParallelismConfig.dp_shard_size`). "
                            "`auto`: the GPUs left after replicas, tensor and context parallel.")
    expert_parallel: ParallelSize = Field(
        1, description="Expert-parallel size of a mixture-of-experts model: each MoE layer's routed experts split "
                       "over this many GPUs of a node, tokens exchanged by all-to-all (transformers' "
                       "`DistributedConfig.ep_size`), composed with FSDP2 over the rest. `auto`: the planner "
                       "searches the sizes that divide the experts and the FSDP group and picks the one with the "
                       "least traffic per step that fits; every MoE plan shows that search and its memory terms "
                       "(docs/moe.md). On the CPU a pinned size splits the experts over that many gloo "
                       "processes (`--nproc-per-node`). Not with LoRA on the routed experts.")
    fsdp_sharding: Literal["full_shard", "hybrid_shard", "shard_grad_op"] = Field(
        "full_shard", description="FSDP sharding strategy.")
    memory_headroom: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory the planner fills without a warning. When no layout fits under it, the first "
                    "whose estimate could still fit within its accuracy band (the band's low end under the whole GPU) "
                    "is planned with a warning (`tight fit`); only beyond that is the recipe refused.")
    timeout_minutes: float = Field(
        60.0, gt=0,
        description="How long a process waits for the others at a collective (a barrier, a gradient "
                    "all-reduce) before the job stops with a timeout: torch's `init_process_group(timeout=)` "
                    "and the trainer's `ddp_timeout` (Axolotl's `ddp_timeout`, here in minutes). 60 leaves room "
                    "for the main process saving or merging a large model while the others wait, and still "
                    "ends a hung job within the hour (NCCL's own default is 10).")
    max_restarts: int = Field(
        0, ge=0, description="Elastic restarts: how often torch's elastic agent (torchrun, or accelerate launch "
                             "through it) restarts the whole worker group after a worker fails before the job "
                             "fails (`--max-restarts`). Each restarted worker resumes from the newest complete "
                             "checkpoint of the run (`output.save_steps` sets how much work a restart repeats). "
                             "0: a failed worker ends the job.")
    rdzv_backend: Literal["static", "c10d", "etcd"] = Field(
        "static", description="How the nodes of a launch find each other (`--rdzv-backend`): `static` (fixed node "
                              "ranks at the main node's address and port), `c10d` (a TCP store at "
                              "`rdzv_endpoint`; nodes may be replaced on a restart) or `etcd` (an etcd server at "
                              "`rdzv_endpoint`). c10d on several nodes and etcd need `rdzv_endpoint`.")
    rdzv_endpoint: Optional[str] = Field(
        None, examples=["node001:29400", "${env:MASTER_ADDR}:29400"],
        description="`host:port` of the rendezvous (`--rdzv-endpoint`): the c10d store, or the etcd server. "
                    "Needed by etcd and by c10d on several nodes (every node names the same one); unset on one "
                    "machine, the launcher hosts the store itself.")
    rdzv_id: Optional[str] = Field(
        None, description="The job id every node of one launch shares (`--rdzv-id`); unset: derived from the run "
                          "directory, so the nodes of one run agree and two runs never join each other.")
    launcher: Literal[LAUNCHERS] = Field(
        "auto", description="Who starts the worker processes: `auto` (the backend's launcher, accelerate launch "
                            "or torchrun, on this machine; one process trains in place) or `ray` (Ray Train's "
                            "`TorchTrainer` on an existing Ray cluster, one Ray worker per planned process; "
                            "`recipeforge launch --ray` asks for it too). Ray restarts the worker group up to "
                            "`max_restarts` times (`FailureConfig(max_failures=...)`).")
    ray_address: Optional[str] = Field(
        None, examples=["auto", "10.0.0.1:6379", "ray://head:10001"],
        description="The Ray cluster `launcher: ray` runs on: `host:port` of its head (GCS), `ray://host:port` "
                    "(Ray Client) or `auto` (a cluster started on this machine). Unset: the `RAY_ADDRESS` "
                    "environment variable, else `auto`.")

    def pinned_size(self, key: str) -> int | None:
        """The size the recipe pins for parallel dimension `key` (None: `auto`, the planner chooses)."""
        value = getattr(self, key)
        return None if value == "auto" else int(value)


class HardwareConfig(Section):
    """The machine(s) to plan for when not planning for the local one."""

    nodes: int = Field(1, ge=1, description="Number of machines.")
    gpus_per_node: int = Field(1, ge=0, description="GPUs per machine (0: CPU only).")
    gpu: Optional[str] = Field(None, description="Accelerator name, e.g. H100-80GB, A100-40GB, L4-24GB.")
    cpu_ram_gb: Optional[float] = Field(
        None, gt=0, description="Host memory per machine in GB, for offload planning (default: probed locally, "
                                "else assumed).")
