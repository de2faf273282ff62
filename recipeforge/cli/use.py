"""The commands that use a finished run's model: chat (in the terminal) and serve (an OpenAI-compatible HTTP
API, bound to this machine unless told, with a key)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge.cli.common import library_warnings_to
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_chat(sub: Subparsers) -> None:
    p = sub.add_parser("chat", help="talk to a finished run's model in the terminal (streamed replies)",
                       description="Chat with final/ of a run (a LoRA adapter is loaded on its base, not merged), "
                                   "through the chat template the run trained with. /reset forgets the "
                                   "conversation, /exit leaves, a line of three double quotes starts and ends a "
                                   "multi-line message, Ctrl-C stops a reply.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--system", help="system prompt for the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest reply, in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 for greedy (default 0.7)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="where the model runs (default: cuda when present)")
    p.set_defaults(func=cmd_chat, pauses_collector=True)


def cmd_chat(args: argparse.Namespace) -> int:
    from recipeforge.tools.chat import Sampling, chat, load_chat_model

    if args.max_new_tokens < 1 or args.temperature < 0:
        raise RecipeError("--max-new-tokens must be 1 or more and --temperature 0 or more",
                          hint="e.g. --max-new-tokens 256 --temperature 0.7 (0: greedy)")
    try:
        import readline  # noqa: F401  line editing and history for input() on a terminal
    except ImportError:
        pass
    # Bytes that are not text (a binary file piped in, a terminal in another encoding) become U+FFFD
    # instead of ending the chat with a decoding error.
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")
    run_dir = Path(args.run_dir)
    with library_warnings_to(run_dir):
        model, tokenizer = load_chat_model(run_dir, device=args.device)
        chat(model, tokenizer, system=args.system,
             sampling=Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature))
    return 0


def add_serve(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="serve a finished run's model on an OpenAI-compatible HTTP API",
                       description="Serve final/ of a run at /v1/chat/completions, /v1/completions (streamed or "
                                   "not; token-id prompts and prompt_logprobs as vLLM takes them), /v1/models "
                                   "and /tokenize. --engine vllm hands it to `vllm serve` (a LoRA adapter "
                                   "served as an adapter on its base); transformers (the default without vLLM) "
                                   "answers one request at a time. Binds to 127.0.0.1 unless --host says otherwise.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 takes any free port)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $RECIPEFORGE_API_KEY, else no "
                                      "key; the variable keeps the key out of the process list)")
    p.add_argument("--insecure", action="store_true",
                   help="serve on an address other machines reach (--host) without an API key (warned)")
    p.add_argument("--name", help="the model's name in the API (default: the run directory's name)")
    p.add_argument("--engine", choices=["auto", "transformers", "vllm"], default="auto",
                   help="auto (default): vllm when it is installed, else transformers")
    p.add_argument("--device", choices=["cpu", "cuda"], help="transformers engine: where the model runs "
                                                            "(default: cuda when present)")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION",
                   help="vllm engine: the share of the GPU (on a CPU: of host memory) vLLM takes for weights and "
                        "KV cache (default: vLLM's own, 0.92 of a GPU's memory)")
    p.add_argument("--max-logprobs", type=int, metavar="N",
                   help="the most prompt_logprobs a request may ask for per position (default 20, as vLLM's "
                        "max_logprobs; a served distillation teacher needs at least distill.top_k)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from recipeforge.tools.serve_engines import api_key_from, serve

    if not 0 <= args.port <= 65535:
        raise RecipeError(f"--port {args.port} is not a port", hint="give 1-65535, or 0 for any free port")
    share = args.gpu_memory_utilization
    if share is not None and not 0 < share <= 1:
        raise RecipeError(f"--gpu-memory-utilization {share} is not a share", hint="give a fraction, e.g. 0.5")
    if args.max_logprobs is not None and not 1 <= args.max_logprobs <= 1_000_000:
        raise RecipeError(f"--max-logprobs {args.max_logprobs} is not a count of tokens", hint="give e.g. 20 or 64")
    key, source = api_key_from(args.api_key)
    if source == "--api-key":
        print("warning: --api-key puts the key in the process list, where other users of this machine can read "
              "it; export RECIPEFORGE_API_KEY instead", file=sys.stderr)
    serve(Path(args.run_dir), engine=args.engine, host=args.host, port=args.port, name=args.name,
          api_key=key, device=args.device, memory_share=share, insecure=args.insecure,
          max_logprobs=args.max_logprobs)
    return 0
