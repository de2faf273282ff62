"""`recipeforge chat RUN_DIR`: talk to a finished run's model in the terminal.

The model is the run's final/ (full weights, or the LoRA adapter on its base, loaded as an adapter:
nothing is merged or written), with the tokenizer and chat template the run trained with. Replies
stream token by token. The prompt understands:

- ``/reset``: forget the conversation (the system prompt stays);
- ``/exit`` (or Ctrl-D): leave;
- a line holding only ``\"\"\"``: start a multi-line message, ended by another such line;
- Ctrl-C while a reply streams: stop that reply and keep the conversation.

A run whose tokenizer has no chat template (a pretraining run) continues the typed text instead.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TextIO

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from typing import TypeAlias

    # final/ as saved: a transformers model, or peft's model around a LoRA adapter on its base
    ChatModel: TypeAlias = "PreTrainedModel | PeftModel"

BLOCK = '"""'
COMMANDS = {"/reset": "forget the conversation", "/exit": "leave (or Ctrl-D)", "/help": "this list"}


@dataclass
class Conversation:
    """The messages so far, after the optional system prompt."""

    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def reset(self) -> None:
        self.turns.clear()


def load_chat_model(run_dir: Path, *, device: str | None = None) -> tuple[ChatModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a finished run: final/ as saved, an adapter on its base without merging.
    A `RecipeError` when `run_dir` holds no final/ model."""
    final = Path(run_dir) / "final"
    if not (final / "config.json").is_file() and not (final / "adapter_config.json").is_file():
        raise RecipeError(f"{run_dir} has no final/ model to chat with",
                          hint="give the run directory of a finished `recipeforge train` (it writes final/)")
    return load_model_dir(final, device=device)


def load_model_dir(model_dir: Path, *, device: str | None = None) -> tuple[ChatModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a saved model directory (final/ or a checkpoint): full weights, or a LoRA
    adapter loaded on its base without merging; bfloat16 on a GPU, float32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipeforge import start_up
    from recipeforge.outputs.model_files import check_model_dir, load_failure, read_json_file

    start_up.resume(*start_up.MODEL_LOADING)  # the model is made with the collector on
    model_dir = Path(model_dir)
    check_model_dir(model_dir)  # a truncated or damaged file is named before a library trips on it
    adapter = model_dir / "adapter_config.json"
    if adapter.is_file():
        base = read_json_file(adapter, what="adapter config").get("base_model_name_or_path")
        if isinstance(base, str) and Path(base).expanduser().is_dir():
            check_model_dir(Path(base).expanduser(), what="adapter's base model")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        if adapter.is_file():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    except (RecipeError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # safetensors, JSON, tokenizers, peft and transformers each raise their own
        raise load_failure(exc, model_dir) from None
    return model.to(device).eval(), tokenizer


def context_length(model: ChatModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """Tokens the model reads at most: its config's position limit, or the tokenizer's when smaller
    (tokenizers without a limit say 10**30)."""
    config = getattr(model, "config", None)
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    return min((int(v) for v in limits if isinstance(v, int) and 0 < v < 10**9), default=2048)


@dataclass(frozen=True)
class Sampling:
    """How replies are generated: greedy when temperature is 0."""

    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    min_new_tokens: int = 0  # no end of text before this many tokens (the API's `min_tokens`)

    def generate_kwargs(self) -> dict[str, Any]:
        fixed = {"max_new_tokens": self.max_new_tokens,
                 **({"min_new_tokens": self.min_new_tokens} if self.min_new_tokens else {})}
        if self.temperature <= 0:
            return {"do_sample": False, **fixed}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, **fixed}


def stream_reply(model: ChatModel, tokenizer: PreTrainedTokenizerBase, prompt_ids: torch.Tensor, sampling: Sampling,
                 stop: threading.Event, result: dict[str, Any] | None = None) -> Iterator[str]:
    """The reply's text as it is generated (a generation thread feeds a streamer); `stop` set from
    the caller ends the generation at the next token. `result["ids"]`, when given, receives the
    generated sequence (prompt included) once the stream ends."""
    from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

    class Stopped(StoppingCriteria):  # type: ignore[misc]
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> bool:
            return stop.is_set()

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = {**sampling.generate_kwargs(), "input_ids": prompt_ids, "streamer": streamer, "pad_token_id": pad,
              "attention_mask": prompt_ids.new_ones(prompt_ids.shape),
              "stopping_criteria": StoppingCriteriaList([Stopped()])}
    failed: list[BaseException] = []

    def generate() -> None:
        try:
            ids = model.generate(**kwargs)
        except BaseException as exc:  # said to the reader below, which would otherwise wait forever
            failed.append(exc)
            streamer.end()
            return
        if result is not None:
            result["ids"] = ids

    worker = threading.Thread(target=generate, daemon=True)
    worker.start()
    try:
        yield from streamer
    finally:
        stop.set()
        worker.join()
    if failed:
        raise failed[0]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, conversation: Conversation, text: str,
               device: str | torch.device) -> torch.Tensor:
    """Token ids of the next prompt: the conversation through the chat template with the generation
    prompt added, or (no template) the typed text alone."""
    if getattr(tokenizer, "chat_template", None):
        ids: torch.Tensor = tokenizer.apply_chat_template(conversation.messages(), add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
    else:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return ids.to(device)


def read_message(read_line: Callable[[str], str]) -> str | None:
    """The next message: one line, or the lines between two ``\"\"\"`` lines. None at end of input."""
    try:
        line = read_line(">>> ")
    except EOFError:
        return None
    if line.strip() != BLOCK:
        return line
    lines: list[str] = []
    while True:
        try:
            more = read_line("... ")
        except EOFError:
            return "\n".join(lines)
        if more.strip() == BLOCK:
            return "\n".join(lines)
        lines.append(more)


def chat(model: ChatModel, tokenizer: PreTrainedTokenizerBase, *, system: str | None = None, sampling: Sampling = Sampling(),
         read_line: Callable[[str], str] = input, out: TextIO = sys.stdout) -> int:
    """The interactive loop (see the module docstring); returns the number of replies given."""
    conversation = Conversation(system=system)
    templated = bool(getattr(tokenizer, "chat_template", None))
    if not templated:
        out.write("(this run's tokenizer has no chat template: each message is continued as plain text)\n")
    out.write("type a message; /help lists the commands\n")
    out.flush()
    replies = 0
    while True:
        text = read_message(read_line)
        if text is None or text.strip() == "/exit":
            out.write("\n" if text is None else "")
            return replies
        command = text.strip()
        if command == "/reset":
            conversation.reset()
            out.write("(conversation cleared)\n")
            continue
        if command == "/help":
            out.write("".join(f"  {k:<8} {v}\n" for k, v in COMMANDS.items()) + f'  {BLOCK:<8} start and end a '
                                                                                   "multi-line message\n")
            continue
        if not command:
            continue
        conversation.turns.append({"role": "user", "content": text})
        reply = _reply(model, tokenizer, conversation, text, sampling, out)
        if reply is None:  # past the model's context: the message is not kept
            conversation.turns.pop()
            continue
        if templated:
            conversation.turns.append({"role": "assistant", "content": reply})
        replies += 1


def _reply(model: ChatModel, tokenizer: PreTrainedTokenizerBase, conversation: Conversation, text: str, sampling: Sampling,
           out: TextIO) -> str | None:
    """Stream one reply to `out`; Ctrl-C ends it early. Returns its text, or None (and says why) when the
    conversation no longer fits the model's context or the chat template refuses it."""
    from jinja2.exceptions import TemplateError

    try:
        ids = prompt_ids(tokenizer, conversation, text, model.device)
    except TemplateError as exc:  # e.g. a template that wants roles to alternate
        out.write(f"(the chat template refuses this conversation: {exc}; /reset starts over)\n")
        out.flush()
        return None
    context = context_length(model, tokenizer)
    if ids.shape[1] >= context:
        out.write(f"(this message makes the conversation {ids.shape[1]} tokens long, past the model's context of "
                  f"{context}: write a shorter one, or /reset to start over)\n")
        out.flush()
        return None
    from dataclasses import replace

    sampling = replace(sampling, max_new_tokens=min(sampling.max_new_tokens, context - int(ids.shape[1])))
    stop = threading.Event()
    pieces: list[str] = []
    try:
        for piece in stream_reply(model, tokenizer, ids, sampling, stop):
            pieces.append(piece)
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        stop.set()
        out.write(" [stopped]")
    out.write("\n")
    out.flush()
    return "".join(pieces)
