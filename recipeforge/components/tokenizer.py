"""Tokenizers: the locally built tokenizer of ``tiny:<arch>`` models, real ones, and chat templates.

The tiny tokenizer is a byte-level BPE trained with the `tokenizers` library on a fixed built-in
corpus, so it covers any text, is identical on every machine and needs no download. Its size equals
the tiny models' vocabulary (see `tiny_spec`).
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from typing import Any

from recipeforge.components.chat_templates import TEMPLATES
from recipeforge.errors import Location, RecipeError

PAD, BOS, EOS, TURN_START = "<|pad|>", "<|bos|>", "<|im_end|>", "<|im_start|>"
TINY_SPECIAL_TOKENS = (PAD, BOS, EOS, TURN_START)

# Named chat templates for `data.chat_template` (name -> Jinja text): the library in
# `components.chat_templates`. Each wraps assistant replies in {% generation %} blocks, which the
# SFT label masks follow.
CHAT_TEMPLATES: dict[str, str] = {name: info.text for name, info in TEMPLATES.items()}

# Built-in corpus for the tiny tokenizer: common English words, numbers and punctuation, so that
# every merge slot is used and ordinary text compresses reasonably. Changing it changes every tiny
# tokenizer (and the tokenized-data cache key with it).
_WORDS = """
the a an and or but if then else when while for to of in on at by with from into over under about
is are was were be been being have has had do does did can could will would should may might must
i you he she it we they me him her us them my your his its our their this that these those what which
who whom whose where why how all any both each few more most other some such no not only own same so
than too very just also now here there up down out off again once one two three four five six seven
eight nine ten eleven twelve hundred thousand first second third last next new old good bad big small
long short high low right left yes true false answer question reply say says said tell ask make made
take give go come see look find think know want use work call try need feel become leave put mean keep
let begin seem help show hear play run move live believe bring happen write sit stand lose pay meet
include continue set learn change lead understand watch follow stop create speak read spend grow open
walk win teach offer remember consider appear buy serve die send build stay fall cut reach kill raise
pass sell decide return explain hope develop carry break receive agree support hit produce eat cover
catch draw choose cow dog cat duck sheep pig horse bird frog lion owl mouse bee snake goat chicken
moo woof meow quack baa oink neigh tweet croak roar hoot squeak buzz hiss bleat cluck animal sound
red blue green yellow orange purple black white brown pink gray color apple banana cherry grape lemon
fruit water fire earth air sun moon star sky sea tree house car road city country world day night year
time people man woman child word sentence letter number count add plus minus times equals sum reverse
copy repeat sort list name value key item data text model train test step loss reward example user
assistant system instruction input output response prompt completion chosen rejected good better best
"""
_PUNCT = [".", ",", "?", "!", ":", ";", "-", "'", '"', "(", ")", "=", "+", "*", "/", "#", "\n"]


def _corpus(rows: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = _WORDS.split()
    out = []
    for _ in range(rows):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            if r < 0.08:
                parts.append(str(rng.randint(0, 100)))
            elif r < 0.25:
                parts.append(rng.choice(words).capitalize())
            else:
                parts.append(rng.choice(words))
        out.append(" ".join(parts) + rng.choice(_PUNCT))
    return out


@lru_cache(maxsize=4)
def _tiny_tokenizer_json(vocab_size: int) -> str:
    """The tiny byte-level BPE's serialized form: trained once per machine (kept under the cache root, keyed by
    everything training depends on) and once per process."""
    path = _tiny_cache_path(vocab_size)
    try:
        text = path.read_text(encoding="utf-8")
        if _tiny_vocab_size(text) == vocab_size:
            return text
    except (OSError, ValueError):  # not there yet, unreadable or damaged: train it
        pass
    text = _train_tiny_tokenizer(vocab_size)
    try:  # written whole or not at all: concurrent processes write the same text
        import os
        import tempfile

        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:  # a read-only or full cache folder: train again next time
        pass
    return text


def _tiny_cache_path(vocab_size: int):
    """Where the trained tiny tokenizer of `vocab_size` is kept: under ``RECIPEFORGE_CACHE`` (default
    ~/.cache/recipeforge), named by a hash of what training depends on (corpus, special tokens, the
    `tokenizers` and Python versions), so a change of any of them trains a new one."""
    import sys

    import tokenizers

    from recipeforge.settings import current

    root = current().cache_root()
    key = json.dumps([vocab_size, _WORDS, _PUNCT, TINY_SPECIAL_TOKENS, tokenizers.__version__, sys.version_info[:2],
                      _code_key(_corpus.__code__), _code_key(_train_tiny_tokenizer.__code__)])
    return root / "tiny-tokenizer" / f"{vocab_size}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _tiny_vocab_size(text: str) -> int:
    """The vocabulary size of a serialized tokenizer (ValueError when it does not parse)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text).get_vocab_size()
    except Exception as exc:  # the Rust side raises plain Exception for a damaged file
        raise ValueError(str(exc)) from None


def _code_key(code) -> list:
    """What a function's code object does, as plain data (its bytecode, names and constants): a change of
    the corpus generator or the training settings changes the tiny tokenizer's cache key."""
    consts = [_code_key(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return [code.co_code.hex(), list(code.co_names), consts]


def _train_tiny_tokenizer(vocab_size: int) -> str:
    """Train the tiny byte-level BPE on the built-in corpus; its serialized form."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TINY_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    if tok.get_vocab_size() != vocab_size:  # the corpus is fixed, so this only trips when it is edited
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}")
    bos_id = tok.token_to_id(BOS)
    # Plain tokenization (add_special_tokens=True) starts with BOS, like Llama tokenizers do.
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int):
    """A fresh tokenizer for the tiny models (byte-level BPE, ChatML template, pad/bos/eos set)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_tiny_tokenizer_json(vocab_size))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        additional_special_tokens=[TURN_START], model_max_length=1_000_000,
                                        padding_side="right", clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATES["chatml"]
    return tokenizer


def load_tokenizer(name_or_path: str, *, revision: str | None = None, trust_remote_code: bool = False,
                   vocab_size: int | None = None, location: Location | None = None, key: str = "model.name_or_path"):
    """The tokenizer of a model: built locally for ``tiny:*``, else `AutoTokenizer` (local dir or hub).

    A missing pad token falls back to the EOS token (batches need one); sides are set for training.
    """
    from recipeforge.components.tiny_spec import tiny_arch

    arch = tiny_arch(name_or_path)
    if arch is not None:
        from recipeforge.components.tiny_spec import TINY_VISION, TINY_VISION_TEMPLATE

        tokenizer = build_tiny_tokenizer(vocab_size or 1024)
        if arch in TINY_VISION:  # a tiny VLM: its image token, and a template that writes images
            add_tokens(tokenizer, special=(TINY_VISION[arch]["image_token"],))
            tokenizer.chat_template = TINY_VISION_TEMPLATE
        return tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot load a tokenizer from '{name_or_path}': {_first_line(exc)}", key=key,
                          location=location,
                          hint="use a local directory with tokenizer files, a hub id reachable from here, "
                               "or tiny:llama for an offline model") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "right"
    return tokenizer


def set_chat_template(tokenizer, name: str, *, required: bool, location: Location | None = None,
                      base_dir=None) -> list[int]:
    """Apply `data.chat_template`: keep the tokenizer's own (``tokenizer``), or install a named one or
    a ``.jinja`` file (relative to the recipe file that sets it, then `base_dir`).

    `required` says whether the data needs a template at all (messages/alpaca/conversational rows).
    The special tokens a named template writes are added to the tokenizer when missing; returns the
    ids of the tokens added (their embedding rows are new).
    """
    from recipeforge.components.chat_templates import resolve

    resolved = resolve(name, base_dir=base_dir, location=location)
    if resolved is None:
        if required and not getattr(tokenizer, "chat_template", None):
            raise RecipeError("the tokenizer has no chat template, but the data is conversational",
                              key="data.chat_template", location=location,
                              hint=f"set data.chat_template to one of: {', '.join(CHAT_TEMPLATES)}")
        return []
    tokenizer.chat_template = resolved.text
    return add_tokens(tokenizer, special=resolved.special, plain=resolved.plain)


def add_tokens(tokenizer, *, special=(), plain=()) -> list[int]:
    """Add the tokens the tokenizer lacks (special ones are never split or normalised; plain ones are
    matched in text as written and decoded like words). Returns the ids of the added tokens."""
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab()
    before = len(tokenizer)
    missing_special = [t for t in dict.fromkeys(special) if t not in vocab]
    missing_plain = [t for t in dict.fromkeys(plain) if t not in vocab and t not in missing_special]
    if missing_special:
        tokenizer.add_special_tokens(
            {"extra_special_tokens": [AddedToken(t, normalized=False, special=True) for t in missing_special]},
            replace_extra_special_tokens=False)
    if missing_plain:
        tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in missing_plain])
    return list(range(before, len(tokenizer)))


def special_prefix_ids(tokenizer) -> list[int]:
    """Token ids the tokenizer puts before plain text (e.g. BOS), found by encoding an empty string."""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id
    return [i for i in ids if i != eos]


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash of everything that decides token ids: vocabulary, merges, specials, chat template."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizers: the vocabulary is what we can see
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([str(tokenizer.bos_token), str(tokenizer.eos_token), str(tokenizer.pad_token),
                         getattr(tokenizer, "chat_template", None) or ""]).encode())
    return h.hexdigest()[:16]


def render_chat(tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    """Messages as text through the tokenizer's chat template."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

