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


class ServerRollout:
    """TRL ``rollout_func``: generate on a vLLM server, syncing weights through the filesystem."""

    def __init__(self, timeouts: ServerTimeouts, connect_s: float):
        self.timeouts, self.connect_s = timeouts, connect_s
        self.base_url = timeouts.url.rstrip("/")
        self.client = None
        self.synced_step = 0  # the server starts from the policy's initial weights

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
            self.client = bounded_client_class(self.timeouts)(base_url=self.base_url, connection_timeout=self.connect_s)
        if trainer.state.global_step != self.synced_step:
            self.sync(trainer)
            self.synced_step = trainer.state.global_step
        # Tokenized exactly as TRL's own generation paths do (chat template for conversations).
        ids = trainer._tokenize_prompts(prompts)[0]
        args = trainer.args
        # One completion per prompt row: the sampler already repeats each prompt once per generation.
        out = self.client.generate(prompts=ids, n=1, temperature=args.temperature, top_p=args.top_p,
                                   max_tokens=args.max_completion_length, logprobs=0)
        return {"prompt_ids": out["prompt_ids"], "completion_ids": out["completion_ids"],
                "logprobs": [[lp[0] for lp in seq] for seq in out["logprobs"]]}
