"""GRPO server mode where TRL cannot push weights into the server (a CPU trainer).

TRL's server mode streams the trained weights to vLLM over NCCL, which needs CUDA. Elsewhere the
engine generates through TRL's ``rollout_func`` hook: completions come from the server over HTTP
(TRL's `VLLMClient`), and after every optimizer step the main process writes the policy's weights
(LoRA merged in) as safetensors to ``rollout_weights/`` in the run directory and has the server
reload them in place (vLLM's ``reload_weights``), before any rank generates again. The run
directory must be one the server can read: the same machine, or a shared filesystem. Every request
has the recipe's deadline (`deadline`: ``rollout.timeout_s``, ``rollout.sync_timeout_s``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from recipeforge_vllm.deadline import ServerTimeouts, bounded_client_class, bounded_session


def _merged_state_dict(trainer) -> dict:
    """The policy's full weights under the checkpoint's names: LoRA merged in, sharding gathered."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not hasattr(model, "merge_adapter"):
        return trainer.accelerator.get_state_dict(trainer.model)
    model.merge_adapter()
    try:
        prefix = model.prefix  # "lora_": the adapter's own tensors, merged already
        weights = {}
        for name, tensor in model.state_dict().items():
            if prefix in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            weights[name.replace("modules_to_save.default.", "")] = tensor.detach().clone()
        return weights
    finally:
        model.unmerge_adapter()


def push_weights(weights: dict, folder: Path, base_url: str, *, timeouts: ServerTimeouts | None = None) -> None:
    """Write `weights` (checkpoint names) to `folder`/model.safetensors, atomically, and have the vLLM
    server at `base_url` reload its model from there in place and drop its prefix cache, each request
    within `timeouts.sync_s` (a `RecipeError` naming the server otherwise)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".model.safetensors.tmp"
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp))
    os.replace(tmp, folder / "model.safetensors")
    base_url = base_url.rstrip("/")
    session = bounded_session(timeouts or ServerTimeouts(base_url, generation_s=600.0, sync_s=600.0))
    for path, body in (("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}),
                       ("/reset_prefix_cache", {})):
        response = session.post(base_url + path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{base_url}{path} answered {response.status_code}: {response.text[:500]}")


class _StepHook:
    """What TRL calls ``trainer.vllm_generation.sync_weights()`` at the first generation of each optimizer
    step: here, the rollout's step boundary (`ServerRollout.on_new_step`)."""

    def __init__(self, rollout: "ServerRollout", trainer):
        self.rollout, self.trainer = rollout, trainer

    def sync_weights(self) -> None:
        self.rollout.on_new_step(self.trainer)


def enable_sampler_correction(trainer, rollout: "ServerRollout") -> None:
    """Turn on TRL's importance-sampling correction for completions that come from `rollout`.

    TRL (1.16) computes the trainer's log-probabilities of the sampled tokens and weights each token's
    loss by exp(trainer - sampler), truncated at ``vllm_importance_sampling_clip_max``, only when its
    own vLLM client generates (``use_vllm``). The completions here come from vLLM too, through the
    ``rollout_func`` hook, with the sampler's log-probabilities: the trainer is told so, and its step
    boundary (where TRL would sync its client) is the rollout's."""
    trainer.use_vllm = True
    trainer.vllm_mode = "server"  # no engine in this process (TRL reads it for colocated limits only)
    trainer.vllm_generation = _StepHook(rollout, trainer)
    trainer._last_loaded_step = -1


def record(trainer, name: str, value: float) -> None:
    """Add `value` to the trainer's `name` metric of this step (averaged and logged with the step's records)."""
    if trainer.model.training:
        trainer._metrics["train"][name].append(float(value))


class ServerRollout:
    """TRL ``rollout_func``: generate on a vLLM server, syncing weights through the filesystem."""

    max_staleness = 0  # on-policy: every step generates with the weights of the step before

    def __init__(self, timeouts: ServerTimeouts, connect_s: float):
        self.timeouts, self.connect_s = timeouts, connect_s
        self.base_url = timeouts.url.rstrip("/")
        self.client = None
        self.synced_step = 0  # the server starts from the policy's initial weights

    def attach(self, trainer, *, correction: bool) -> None:
        """Finish wiring the built trainer: the sampler correction when the recipe keeps it on."""
        if correction:
            enable_sampler_correction(trainer, self)

    def on_new_step(self, trainer) -> None:
        """Before the first generation of an optimizer step: the server gets the trained weights."""
        if trainer.state.global_step != self.synced_step:
            self.sync(trainer)
            self.synced_step = trainer.state.global_step

    def sync(self, trainer) -> None:
        """Write the policy's weights where the server reads them and reload them there (main process)."""
        weights = _merged_state_dict(trainer)  # every rank: gathering is collective
        if trainer.accelerator.is_main_process:
            # Next to the trainer's output (checkpoints/): the run directory.
            folder = Path(trainer.args.output_dir).resolve().parent / "rollout_weights"
            push_weights(weights, folder, self.base_url, timeouts=self.timeouts)
        trainer.accelerator.wait_for_everyone()  # nobody generates with the old weights

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        if self.client is None:
            self.client = self.new_client()
        self.on_new_step(trainer)
        start = time.perf_counter()
        out = generate(self.client, trainer, trainer._tokenize_prompts(prompts)[0])
        record(trainer, "rollout/wait_s", time.perf_counter() - start)  # the trainer waits for all of it
        record(trainer, "rollout/staleness", 0)
        return out

    def new_client(self):
        """A client of the server whose every request has the recipe's deadline (`deadline`)."""
        return bounded_client_class(self.timeouts)(base_url=self.base_url, connection_timeout=self.connect_s)


def generate(client, trainer, ids: list) -> dict[str, Any]:
    """Completions of the tokenized prompts `ids` from the server `client` talks to, with the sampled
    tokens' log-probabilities (TRL's ``rollout_func`` output)."""
    args = trainer.args
    # One completion per prompt row: the sampler already repeats each prompt once per generation.
    out = client.generate(prompts=ids, n=1, temperature=args.temperature, top_p=args.top_p,
                          max_tokens=args.max_completion_length, logprobs=0)
    return {"prompt_ids": out["prompt_ids"], "completion_ids": out["completion_ids"],
            "logprobs": [[lp[0] for lp in seq] for seq in out["logprobs"]]}
