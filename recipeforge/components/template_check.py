"""One chat template from training to serving: the tokens a run trains on equal what a server sends the model.

A chat model is trained on whole conversations rendered by `data.chat_template` and tokenized in one
piece (`lm_data.tokenize_batch`, the reference of the training encoder). At serving time,
`recipeforge serve`, vLLM and TRL's rollouts render the conversation up to the next reply with
``add_generation_prompt=True``, tokenize that text without special tokens, and let the model write
the reply. Both must give the model the same tokens before each reply it learned to write: a different
template (the base model's own template on the server, a BOS written twice, a whitespace after the
turn header, tokens merged across the reply boundary) shows the model a context it never saw.

`first_mismatch` renders probe conversations (system prompt, several turns, a tool call where the
template renders tools) both ways and returns the first differing token, with the conversation, the
reply and the position. Pure comparison: the caller chooses the serving side (the tokenizer as the run
saves it, a template file given to the server, a served model's directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE = -100

# Conversations that exercise what templates treat specially: a system prompt, several turns (the
# history of earlier replies), a reply with reasoning (served in thinking mode), and a tool call with its result (`TOOL_PROBE`, only for templates
# that render tool calls).
PROBES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is 2 + 3?"},
     {"role": "assistant", "content": "2 + 3 = 5."}],
    [{"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "And another one?"},
     {"role": "assistant", "content": "Green, like grass."}],
    [{"role": "user", "content": "Is 7 prime?"},
     {"role": "assistant", "content": "<think>\n7 has no divisor but 1 and 7.\n</think>\n\nYes, 7 is prime."}],
)
TOOL_PROBE: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 12 * 7?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "calculate", "arguments": {"expression": "12 * 7"}}}]},
    {"role": "tool", "name": "calculate", "content": "84"},
    {"role": "assistant", "content": "12 * 7 = 84."},
]


@dataclass(frozen=True)
class Mismatch:
    """Where the trained tokens and the served tokens first differ."""

    conversation: int   # index among the probes checked
    reply: int          # which assistant reply of the conversation (0-based)
    position: int       # token position in the conversation
    train_token: str | None   # None: the trained context ended here
    serve_token: str | None   # None: the served prompt ended here
    context: str        # the tokens before the position (decoded, cut to the last 40 characters)

    def describe(self) -> str:
        """One sentence naming the differing tokens and where they are."""
        def shown(token: str | None) -> str:
            return "nothing (it ends here)" if token is None else repr(token)

        return (f"before assistant reply {self.reply + 1} of probe conversation {self.conversation + 1}, token "
                f"{self.position} differs: training has {shown(self.train_token)}, serving has "
                f"{shown(self.serve_token)} (after {self.context[-40:]!r})")


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template writes an assistant's tool call (so it is checked too)."""
    try:
        text = tokenizer.apply_chat_template(TOOL_PROBE, tokenize=False)
    except Exception:  # a template that rejects the tool role or tool_calls: no tool format to check
        return False
    return "calculate" in text and "12 * 7" in text


def probes_for(tokenizer) -> list[list[dict[str, Any]]]:
    """The probe conversations for a tokenizer: the plain ones, and the tool call when it renders tools.
    A template without a system role (Gemma's folds it into the user turn) still takes the system probe."""
    probes = [list(p) for p in PROBES]
    if renders_tools(tokenizer):
        probes.append(list(TOOL_PROBE))
    return probes


def train_encoding(tokenizer, messages: list[dict[str, Any]], *, eot_tokens: tuple[str, ...] = ()
                   ) -> tuple[list[int], list[int]]:
    """(ids, labels) of a conversation as training encodes it: the reference encoder, loss on the replies."""
    from recipeforge.components.lm_data import tokenize_batch

    batch = {"messages": [messages], "_format": ["messages"], "_row": [0]}
    out = tokenize_batch(batch, tokenizer=tokenizer, train_on_inputs=False, sequence_len=1 << 30,
                         truncation="truncate", mask_inputs=True, eot_tokens=eot_tokens)
    return list(out["input_ids"][0]), list(out["labels"][0])


def reply_starts(labels: list[int]) -> list[int]:
    """Positions where a trained span (an assistant reply) begins."""
    return [i for i, label in enumerate(labels) if label != IGNORE and (i == 0 or labels[i - 1] == IGNORE)]


def serve_prompt_ids(tokenizer, messages: list[dict[str, Any]], *, thinking: bool = True) -> list[int]:
    """Token ids a server gives the model before it writes the next reply: the conversation so far
    rendered with the generation prompt, tokenized without added special tokens (as vLLM's chat
    endpoint, TRL's rollouts and `recipeforge serve` do). `thinking` is the ``enable_thinking``
    template variable (Qwen3's reasoning switch; other templates ignore it)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def first_mismatch(train_tokenizer, serve_tokenizer, conversations: list[list[dict[str, Any]]] | None = None,
                   *, eot_tokens: tuple[str, ...] = ()) -> Mismatch | None:
    """The first token where training and serving differ before a reply, or None when they agree.

    For every assistant reply of every conversation, the trained ids up to the reply's first trained
    token must equal the served prompt of the messages before it. A reply the training encoder does
    not mark as trained (a template without generation blocks that hides it) counts as a mismatch at
    the end of the served prompt.
    """
    conversations = probes_for(train_tokenizer) if conversations is None else conversations
    for c, messages in enumerate(conversations):
        ids, labels = train_encoding(train_tokenizer, messages, eot_tokens=eot_tokens)
        starts = reply_starts(labels)
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for r, at in enumerate(replies):
            trained = ids[:starts[r]] if r < len(starts) else ids
            # Served in thinking or non-thinking mode (Qwen3 writes an empty think block in the prompt of
            # the latter; other templates render both alike): the reply's context must equal one of them.
            found = [_diff(trained, serve_prompt_ids(serve_tokenizer, messages[:at], thinking=mode))
                     for mode in (True, False)]
            if any(d is None for d in found):
                continue
            pos, served = max((d for d in found if d is not None), key=lambda d: d[0])
            t = trained[pos] if pos < len(trained) else None
            s = served[pos] if pos < len(served) else None
            return Mismatch(c, r, pos, _token(train_tokenizer, t), _token(serve_tokenizer, s),
                            train_tokenizer.decode(trained[:pos]))
    return None


def _diff(trained: list[int], served: list[int]) -> tuple[int, list[int]] | None:
    """(first differing position, served ids), or None when the two are equal."""
    if trained == served:
        return None
    pos = next((i for i, (a, b) in enumerate(zip(trained, served)) if a != b), min(len(trained), len(served)))
    return pos, served


def _token(tokenizer, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    return str(tokenizer.convert_ids_to_tokens(token_id))


def saved_tokenizer(tokenizer, folder) -> Any:
    """The tokenizer as a server loads it from a run's output: saved to `folder`, read back."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


def recipe_tokenizer(recipe, *, base_dir, locate) -> tuple[Any, tuple[str, ...]]:
    """The tokenizer a run of `recipe` trains with (its `data.chat_template` and tokens installed), and
    the template's turn-end tokens."""
    from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
    from recipeforge.components.tokenizer import load_tokenizer
    from recipeforge.components.vocab import prepare_tokenizer

    m = recipe.model
    arch = tiny_arch(m.name_or_path)
    tokenizer = load_tokenizer(m.tokenizer or m.name_or_path, revision=m.revision, trust_remote_code=m.trust_remote_code,
                               vocab_size=TINY_CONFIGS.get(arch, {}).get("vocab_size") if arch else None)
    prepare_tokenizer(tokenizer, recipe, base_dir=base_dir, locate=locate)
    return tokenizer, turn_end_tokens(recipe, base_dir=base_dir, locate=locate)


def turn_end_tokens(recipe, *, base_dir, locate) -> tuple[str, ...]:
    """The tokens that end a turn in training: `model.eot_tokens` and the template's own turn end."""
    from recipeforge.components.chat_templates import resolve

    resolved = resolve(recipe.data.chat_template, base_dir=base_dir, location=locate(("data", "chat_template")))
    return tuple(recipe.model.eot_tokens) + ((resolved.eot,) if resolved is not None and resolved.eot else ())


def serve_tokenizer(train_tokenizer, serve: str | None, *, folder) -> tuple[Any, str]:
    """The serving side and how to name it: `serve` is a model or tokenizer directory a server loads,
    a template name or a ``.jinja`` file given to the server (``vllm serve --chat-template``), or None
    for the run's own output (the tokenizer saved as a run saves it, read back)."""
    import copy
    from pathlib import Path

    from recipeforge.components.chat_templates import resolve
    from recipeforge.errors import RecipeError

    if serve is None:
        return saved_tokenizer(train_tokenizer, folder), "the tokenizer a run saves (what serve and vLLM load)"
    if Path(serve).is_dir():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(serve), f"the tokenizer in {serve}"
        except (OSError, ValueError) as exc:
            raise RecipeError(f"cannot load a tokenizer from '{serve}': {str(exc).splitlines()[0]}",
                              hint="give --serve a model or tokenizer directory, a template name or a .jinja file"
                              ) from None
    resolved = resolve(serve, key="--serve")
    if resolved is None:  # `tokenizer`: the model tokenizer's own template
        return saved_tokenizer(train_tokenizer, folder), "the tokenizer a run saves (what serve and vLLM load)"
    tokenizer = copy.deepcopy(train_tokenizer)
    tokenizer.chat_template = resolved.text
    return tokenizer, f"the chat template {serve}"


def check_recipe_template(recipe, *, base_dir, locate, serve: str | None = None) -> tuple[int, int]:
    """Raise `RecipeError` at ``data.chat_template`` when training and serving (`serve_tokenizer`) give the
    model different tokens before a reply; else (conversations, replies) checked."""
    import tempfile

    from recipeforge.errors import RecipeError

    train, eots = recipe_tokenizer(recipe, base_dir=base_dir, locate=locate)
    with tempfile.TemporaryDirectory(prefix="rf-template-") as folder:
        served, name = serve_tokenizer(train, serve, folder=folder)
        probes = probes_for(train)
        found = first_mismatch(train, served, probes, eot_tokens=eots)
    if found is not None:
        raise RecipeError(f"the chat template trained with (data.chat_template: {recipe.data.chat_template}) and "
                          f"{name} disagree: {found.describe()}", key="data.chat_template",
                          location=locate(("data", "chat_template")),
                          hint="set data.chat_template to the template the server applies, or start the server "
                               "with the run's template (recipeforge serve RUN_DIR, or vllm serve "
                               "--chat-template with the run's chat_template.jinja)")
    return len(probes), sum(m["role"] == "assistant" for p in probes for m in p)


def trains_chat(recipe) -> bool:
    """Whether a recipe trains on conversations its chat template renders (a `messages` dataset, or
    `alpaca` without a text prompt of its own): the tokens the training encoder makes of them are what
    a server must give the model again."""
    from recipeforge.components.formats import formats

    for spec in recipe.data.datasets:
        fmt = formats.get(spec.format) if formats.has(spec.format) else None
        if fmt is not None and fmt.kind == "lm" and fmt.to_messages is not None and getattr(spec, "prompt", None) is None:
            return True
    return False


def check_run_template(tokenizer, recipe, *, base_dir, locate) -> int | None:
    """At the start of training: refuse (`RecipeError` at ``data.chat_template``) when the tokens the run
    trains on before a reply differ from what a server gives the model from the tokenizer this run
    saves. Returns the replies checked, or None when the recipe is not a chat recipe or
    ``data.template_check`` is off. Tokenizer only: a few conversations rendered both ways."""
    import tempfile

    from recipeforge.errors import RecipeError

    if not recipe.data.template_check or not trains_chat(recipe):
        return None
    eots = turn_end_tokens(recipe, base_dir=base_dir, locate=locate)
    probes = probes_for(tokenizer)
    with tempfile.TemporaryDirectory(prefix="rf-template-") as folder:
        found = first_mismatch(tokenizer, saved_tokenizer(tokenizer, folder), probes, eot_tokens=eots)
    if found is not None:
        # The differing tokens first: a long message is cut at its end.
        raise RecipeError(f"{found.describe()}: a server given the run's tokenizer would show the model other tokens "
                          f"than it trains on", key="data.chat_template", location=locate(("data", "chat_template")),
                          hint="make the template's add_generation_prompt part write exactly what it writes before "
                               "an assistant reply (or use a shipped template: recipeforge check-template RECIPE "
                               "tells when they agree); data.template_check: false trains anyway")
    return sum(m["role"] == "assistant" for p in probes for m in p)
