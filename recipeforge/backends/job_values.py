"""Values that go into generated job files (an sbatch script, Kubernetes manifests, a Ray job), checked by
the rules of the format they land in.

A generated file is read by a parser with rules of its own: bash runs every line of an sbatch script
that is not a comment, sbatch stops reading ``#SBATCH`` lines at the first command, Kubernetes names are
DNS labels, and the kubelet expands ``$(VAR)`` in a container's command. A value from a command-line flag
or a recipe (a partition, a run name, an override) is never pasted into such a file as it is: it is
refused with the flag or key to fix when it cannot be written safely (a control character, a character
the field cannot hold), and escaped by the format's own rules otherwise (`shlex` for the shell, ``$$``
for Kubernetes' expansion, a YAML emitter for manifests). Pure Python: `launch` imports no torch.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable

from recipeforge.errors import RecipeError, excerpt

# Slurm names (partitions, accounts, QOS): letters, digits and _ . - + : ; a partition may be a list.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.+:-]+(?:,[A-Za-z0-9_.+:-]+)*")
# Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
_SLURM_TIME = re.compile(r"\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}|(?i:unlimited|infinite)")
# RFC 1123 label (namespaces, ConfigMap keys' objects) and subdomain (PersistentVolumeClaim names).
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
# An image reference as container runtimes parse it: [registry[:port]/]path[:tag][@digest].
_IMAGE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def control_characters(value: str) -> list[str]:
    """The control characters (newline, carriage return, NUL, escape, line separators...) in `value`,
    as escapes."""
    return sorted({repr(ch)[1:-1] for ch in value
                   if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in "\u0085\u2028\u2029"})


def no_control(value: str, key: str, *, where: str) -> str:
    """`value` unchanged; a `RecipeError` at `key` when it holds a control character, which would start a
    new line (a new command, a new header) in the generated `where`."""
    found = control_characters(value)
    if found:
        raise RecipeError(f"{excerpt(value)} holds control characters ({', '.join(found)}), which cannot go into "
                          f"{where}: a line break there starts a new line of the file", key=key,
                          hint="remove the line breaks and other control characters from the value")
    return value


def slurm_name(value: str, key: str) -> str:
    """A partition, account or QOS for an ``#SBATCH`` line."""
    no_control(value, key, where="the sbatch script")
    if not _SLURM_NAME.fullmatch(value):
        raise RecipeError(f"{excerpt(value)} is not a Slurm name (letters, digits, _ . - + :, comma-separated)",
                          key=key, hint="give the name as `sinfo`/`sacctmgr` list it, e.g. gpu or gpu,gpu-long")
    return value


def slurm_time(value: str, key: str = "--time") -> str:
    """A wall-clock limit in one of Slurm's formats."""
    no_control(value, key, where="the sbatch script")
    if not _SLURM_TIME.fullmatch(value):
        raise RecipeError(f"{excerpt(value)} is not a Slurm time limit", key=key,
                          hint="minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 48:00:00")
    return value


def sbatch_option(value: str, key: str = "--sbatch-option") -> str:
    """A further ``#SBATCH`` option as the user wrote it: an option (starting with '-') on one line."""
    no_control(value, key, where="the sbatch script")
    if not value.strip().startswith("-"):
        raise RecipeError(f"{excerpt(value)} is not an sbatch option", key=key,
                          hint="give it as sbatch takes it, e.g. --sbatch-option=--constraint=h100")
    return value.strip()


def sbatch_path(value: str, key: str) -> str:
    """A path in an ``#SBATCH`` line (the job's log): sbatch reads whitespace as the end of the value and
    ``%`` as one of its filename patterns."""
    no_control(value, key, where="the sbatch script")
    bad = sorted({ch for ch in value if ch.isspace() or ch in "%\"'\\"})
    if bad:
        raise RecipeError(f"{excerpt(value)} holds {', '.join(repr(c) for c in bad)}, which sbatch reads as part of its "
                          "own syntax in #SBATCH --output", key=key,
                          hint="set output.dir to a path without spaces, quotes, backslashes or %")
    return value


def job_name(text: str, *, fallback: str = "recipeforge", limit: int = 64) -> str:
    """`text` as a job name any scheduler takes: letters, digits, '.', '_' and '-' (others become '-')."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or fallback
    return name[:limit]


def dns_label(value: str, key: str) -> str:
    """A Kubernetes name that must be an RFC 1123 label (a namespace)."""
    no_control(value, key, where="the Kubernetes manifests")
    if not _DNS_LABEL.fullmatch(value):
        raise RecipeError(f"{excerpt(value)} is not a valid Kubernetes name: lowercase letters, digits and '-', "
                          "starting and ending with a letter or digit, at most 63 characters", key=key,
                          hint="as `kubectl get namespaces` lists it, e.g. ml-team")
    return value


def dns_subdomain(value: str, key: str) -> str:
    """A Kubernetes object name that must be an RFC 1123 subdomain (a PersistentVolumeClaim)."""
    no_control(value, key, where="the Kubernetes manifests")
    if not _DNS_SUBDOMAIN.fullmatch(value):
        raise RecipeError(f"{excerpt(value)} is not a valid Kubernetes object name: lowercase letters, digits, "
                          "'-' and '.', at most 253 characters", key=key,
                          hint="as `kubectl get pvc` lists it, e.g. training-runs")
    return value


def image_reference(value: str, key: str = "--image") -> str:
    """A container image reference ([registry[:port]/]name[:tag][@digest])."""
    no_control(value, key, where="the Kubernetes manifests")
    if len(value) > 4096 or not _IMAGE.fullmatch(value):
        raise RecipeError(f"{excerpt(value)} is not a container image reference", key=key,
                          hint="e.g. ghcr.io/my-org/recipeforge:0.9 or registry.local:5000/trainer@sha256:<digest>")
    return value


def k8s_literal(value: str) -> str:
    """`value` as a literal argument of a container's command: the kubelet expands ``$(NAME)`` from the
    container's environment there, ``$$`` is a literal ``$``."""
    return value.replace("$", "$$")


def check_command_values(values: Iterable[tuple[str, str]], *, where: str) -> None:
    """Each (key, value) of a command line written into a generated file: no control characters (a
    line break would end the command there), and no credential (the file is read by whoever reads the
    run directory or the job)."""
    from recipeforge.credentials import credential_kinds, is_secret_key

    for key, value in values:
        name, sep, rest = value.partition("=")
        secret = credential_kinds(value) or (sep and is_secret_key(name.lstrip("~")) and rest)
        if secret:
            raise RecipeError(f"{key} holds a credential, which would be written in clear into {where}", key=key,
                              hint="give it to the job through its environment (e.g. HF_TOKEN, WANDB_API_KEY, from "
                                   "a secret store) and refer to it as ${env:NAME} in the recipe")
        no_control(value, key, where=where)
