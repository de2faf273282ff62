"""Credentials recognised by their shape, wherever they stand in a text.

Redaction by key name (`errors.is_secret_key`) misses a token pasted into free text: a description,
a run name, a dataset path, a tracker URL, a library's warning. These are the shapes that are
credentials whatever their key: Hugging Face, OpenAI, Anthropic, GitHub, GitLab, PyPI, npm, Slack,
Stripe, Azure, AWS and Google keys and tokens (and a few more services' prefixed keys), W&B API keys,
JWTs and bearer tokens, private-key blocks, URL userinfo and `key=value` pairs whose key names a
secret. `redact_credentials` hides them in any text that is printed or written.

Bare 40-character hex strings are git commit ids as often as legacy W&B keys (a `model.revision`, a
hub cache path); they count as W&B keys only next to a word that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

REDACTED = "<redacted>"

# Key names whose value is a credential: hf_token, hub_token, api_key, apikey, db_password, secret, ...
# `token` only as the last word and not a tokenizer's special token: hf_token, hub_token, access_token
# are credentials; tokenizer, max_tokens, pad_token and pad_token_id are not.
_SECRET_KEY = re.compile(r"secret|passw(or)?d|api_?key|access_?key|private_?key|credential|"
                         r"(^|_)(?<!pad_)(?<!eos_)(?<!bos_)(?<!unk_)(?<!sep_)(?<!cls_)(?<!mask_)(?<!per_)token$",
                         re.IGNORECASE)


def is_secret_key(key: object) -> bool:
    """Whether a key's name (its last part, for a dotted key) says its value is a credential."""
    return isinstance(key, str) and bool(_SECRET_KEY.search(last_part(key)))


def last_part(key: str) -> str:
    """The last part of a dotted or indexed key: `logging.mlflow.password` -> `password`."""
    return re.split(r"[.\[]", key.rstrip("]"))[-1] if "." in key or "[" in key else key


@dataclass(frozen=True)
class Shape:
    """One kind of credential: its name (for messages) and the pattern of the secret part."""

    name: str
    pattern: re.Pattern
    group: int = 0  # the part of a match that is secret (0: all of it)
    accept: Callable[[re.Match], bool] | None = None  # a further check of a match


def _secret_key_match(match: re.Match) -> bool:
    return is_secret_key(match.group("key").replace("-", "_"))


# `key=value` / `key: value` in free text (`api_key=...`, `HF_TOKEN: ...`, `?access_token=...`), kept
# when the key is named like a credential (is_secret_key: not pad_token, max_tokens, ...) and the value
# is not a plain number (a count such as `"flops_per_token": 1229760` in a plan).
# The value sits in a lookahead, so a key that is not a credential's (`https` of a URL) consumes
# nothing and the next key (`access_token` in its query) is still seen.
_KEY_VALUE = re.compile(r"(?<![A-Za-z0-9_-])(?P<key>[A-Za-z][A-Za-z0-9_-]{1,60})"
                        r"(?=[\"']?\s*[=:]\s*[\"']?(?![\d.eE+-]+(?:[\s\"'&,;<>]|$))([^\s\"'&,;<>]{6,}))")

_B64URL = r"[A-Za-z0-9_-]"
SHAPES: tuple[Shape, ...] = (
    # A private-key block (PEM, OpenSSH, PGP), up to its END line or, pasted cut short, to the end of the text.
    Shape("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                                    r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|$(?![\s\S]))")),
    Shape("Hugging Face token", re.compile(r"(?<![A-Za-z0-9])(?:hf|api_org)_[A-Za-z0-9]{30,}(?![A-Za-z0-9])")),
    Shape("Anthropic API key", re.compile(r"(?<![A-Za-z0-9])sk-ant-[a-z]+\d*-[A-Za-z0-9_\-]{20,}")),
    Shape("OpenAI-style API key", re.compile(r"(?<![A-Za-z0-9])sk-(?:[A-Za-z]+-)?[A-Za-z0-9_\-]{20,}")),
    Shape("GitHub token", re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{50,})")),
    # GitLab: personal, deploy, runner, CI job, trigger, feed, OAuth application and agent tokens.
    Shape("GitLab token", re.compile(r"(?<![A-Za-z0-9])(?:glpat|gldt|glrt|glcbt|glptt|glft|glimt|glagent|gloas|"
                                     r"glsoat|glffct|glwt)-[A-Za-z0-9_.\-]{20,}|(?<![A-Za-z0-9])GR1348941"
                                     r"[A-Za-z0-9_\-]{20,}")),
    Shape("PyPI token", re.compile(r"(?<![A-Za-z0-9])pypi-Ag[A-Za-z0-9_\-]{50,}")),
    Shape("npm token", re.compile(r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])")),
    Shape("AWS access key", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![A-Za-z0-9])")),
    # An AWS secret access key is 40 characters of base64: a secret only next to a word that says AWS.
    Shape("AWS secret key", re.compile(r"(?i)(?:aws|amazon)[^\n]{0,40}?(?<![A-Za-z0-9/+])([A-Za-z0-9/+]{40})"
                                       r"(?![A-Za-z0-9/+=])"), group=1,
          accept=lambda m: bool(re.search(r"[0-9/+]", m.group(1)) and re.search(r"[a-z]", m.group(1))
                                and re.search(r"[A-Z]", m.group(1)))),
    Shape("Google API key", re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])")),
    Shape("Google OAuth token", re.compile(r"(?<![A-Za-z0-9])(?:ya29\.[0-9A-Za-z_\-]{20,}|1//0[0-9A-Za-z_\-]{30,}"
                                           r"|GOCSPX-[0-9A-Za-z_\-]{20,})")),
    Shape("Slack token", re.compile(r"(?<![A-Za-z0-9])(?:xox[abposre]|xapp)-[A-Za-z0-9\-]{10,}")),
    Shape("Slack webhook", re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9_/\-]{20,})"),
          group=1),
    Shape("Stripe key", re.compile(r"(?<![A-Za-z0-9])(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,})")),
    # Azure: a storage or service-bus connection string's key, a SAS signature, an Entra ID client
    # secret (three characters, a digit, "Q~", then 31-34), and 32 hex digits next to the word Azure.
    Shape("Azure key", re.compile(r"(?i)(?:AccountKey|SharedAccessKey)\s*=\s*([A-Za-z0-9+/]{20,}={0,2})"), group=1),
    Shape("Azure SAS signature", re.compile(r"[?&]sig=([A-Za-z0-9%+/=]{20,})"), group=1),
    Shape("Azure client secret", re.compile(r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}"
                                            r"(?![A-Za-z0-9_~.\-])")),
    Shape("Azure key", re.compile(r"(?i)azure[^\n]{0,40}?(?<![0-9a-f])([0-9a-f]{32})(?![0-9a-f])"), group=1),
    # Keys of services ML code calls, by their prefixes: SendGrid, Databricks, Replicate, Groq, DigitalOcean.
    Shape("SendGrid key", re.compile(r"(?<![A-Za-z0-9])SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}")),
    Shape("Databricks token", re.compile(r"(?<![A-Za-z0-9])dapi[0-9a-f]{32}(?:-\d)?(?![A-Za-z0-9])")),
    Shape("Replicate token", re.compile(r"(?<![A-Za-z0-9])r8_[A-Za-z0-9]{37}(?![A-Za-z0-9])")),
    Shape("Groq key", re.compile(r"(?<![A-Za-z0-9])gsk_[A-Za-z0-9]{48,}(?![A-Za-z0-9])")),
    Shape("DigitalOcean token", re.compile(r"(?<![A-Za-z0-9])do[opr]_v1_[0-9a-f]{64}(?![A-Za-z0-9])")),
    # W&B: on-prem keys (`local-<40 hex>`), the 86-character keys of 2025 on, and 40 hex next to "wandb".
    Shape("W&B API key", re.compile(r"(?<![A-Za-z0-9-])(?:local|vm)-[0-9a-f]{40}(?![A-Za-z0-9])")),
    Shape("W&B API key", re.compile(r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9_]*[0-9])(?=[A-Za-z0-9_]*[A-Za-z])"
                                    r"[A-Za-z0-9_]{80,100}(?![A-Za-z0-9_])")),
    Shape("W&B API key", re.compile(r"(?i)(?:wandb|w&b|weights ?& ?biases)[^\n]{0,40}?(?<![0-9a-f])([0-9a-f]{40})"
                                    r"(?![0-9a-f])"), group=1),
    Shape("JWT", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    Shape("bearer token", re.compile(r"(?i)\b(?:bearer|basic)\s+([A-Za-z0-9\-._~+/]{8,}=*)"), group=1),
    Shape("URL credentials", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://([^\s/?#@'\"<>]+)@"), group=1),
    Shape("secret value", _KEY_VALUE, group=2, accept=_secret_key_match),
)


def credential_kinds(text: str) -> list[str]:
    """The kinds of credentials in `text` (empty when none)."""
    return sorted({shape.name for shape in SHAPES if _secret_spans(shape, text)})


def redact_credentials(text: str) -> str:
    """`text` with every credential found by its shape replaced: URL userinfo keeps the user name
    (``https://user:***@host``), everything else becomes ``<redacted>``."""
    if not isinstance(text, str) or len(text) < 8:
        return text
    spans: list[tuple[int, int, str]] = []
    for shape in SHAPES:
        for start, end, secret in _secret_spans(shape, text):
            spans.append((start, end, _replacement(shape, secret)))
    if not spans:
        return text
    out, last = [], 0
    for start, end, replacement in sorted(spans, key=lambda span: (span[0], -span[1])):  # the longest match first
        if start < last:  # inside a span already replaced (a token in a URL's userinfo)
            continue
        out.append(text[last:start])
        out.append(replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def _secret_spans(shape: Shape, text: str) -> list[tuple[int, int, str]]:
    spans = []
    for match in shape.pattern.finditer(text):
        if shape.accept is not None and not shape.accept(match):
            continue
        secret = match.group(shape.group)
        if secret and secret != REDACTED and not secret.startswith(("<redacted", "***")):
            spans.append((match.start(shape.group), match.end(shape.group), secret))
    return spans


def _replacement(shape: Shape, secret: str) -> str:
    if shape.name == "URL credentials":
        user, sep, _ = secret.partition(":")
        return f"{user}:***" if sep else "***"
    return REDACTED
