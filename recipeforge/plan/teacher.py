"""The distillation teacher in the memory model (`distill.teacher`).

A colocated teacher (`teacher.name_or_path`) is loaded frozen on every training process, whole
(replicated, never sharded with the student): each GPU holds its weights in the student's compute
dtype, or NF4 with their quantization constants (`load_in_4bit`). The stage scores each micro batch
with it before the student's forward, as it does with a served teacher, so its forward is a phase of
its own: one decoder layer's working tensors without gradients, and its full-vocabulary logits in the
compute dtype with their fp32 log-softmax, from which the top-k targets are taken. The top-k values
and indices stay alive through the student's forward and backward. A served teacher (`teacher.url`)
costs the training GPUs nothing. The teacher's shape comes from the same sources as the student's
(`catalog.resolve_model`: a local config.json, a run directory's final/, the built-in table, a
plugin, the hub); where none has it, it is sized like the student, and the plan says so. Its bytes
per GPU and its lines in the plan: `plan.teacher_memory`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.plan.models import ModelSpec

if TYPE_CHECKING:
    from recipeforge.config.schema.distill import DistillConfig


@dataclass(frozen=True)
class Teacher:
    """A distillation teacher as the planner sizes it."""

    colocated: bool                    # loaded on every training process (False: served over HTTP)
    name: str                          # `name_or_path`, or the served teacher's URL
    model: ModelSpec | None = None     # a colocated teacher's shape
    source: str = ""                   # where that shape came from
    load_in_4bit: bool = False
    top_k: int = 20


def build_teacher(distill: DistillConfig, student: ModelSpec, notes: list[str]) -> Teacher:
    """The `Teacher` of a recipe's `distill:` section; appends to `notes` what its size assumes."""
    t = distill.teacher
    if t.name_or_path is None:
        assert t.url is not None  # exactly one of the two (`TeacherConfig`)
        return Teacher(colocated=False, name=t.url, top_k=distill.top_k)
    model, source = resolve_teacher(t.name_or_path, t.revision, student, notes)
    if model.vocab_size != student.vocab_size:
        notes.append(f"the teacher's vocabulary ({model.vocab_size} entries) is not the student's "
                     f"({student.vocab_size}): distillation compares token ids, so both must use the same tokenizer "
                     "(a larger embedding padded for speed is fine)")
    return Teacher(colocated=True, name=t.name_or_path, model=model, source=source, load_in_4bit=t.load_in_4bit,
                   top_k=distill.top_k)


def resolve_teacher(name_or_path: str, revision: str | None, student: ModelSpec,
                    notes: list[str]) -> tuple[ModelSpec, str]:
    """The teacher's `ModelSpec` and where it came from: its config.json (in a run directory, that of
    its final/), the built-in table, a plugin or the hub; else the student's shape, with a note."""
    from recipeforge.plan.catalog import resolve_model

    path = Path(name_or_path).expanduser()
    if path.is_dir() and not (path / "config.json").is_file() and (path / "final" / "config.json").is_file():
        name_or_path = str(path / "final")  # a run directory: its exported model
    try:
        return resolve_model(name_or_path, revision)
    except RecipeError as exc:
        why = exc.problems[0].message if exc.problems else str(exc)
        notes.append(f"the distillation teacher is sized like the student (its shape is unknown here: {why})")
        return dataclasses.replace(student, name=name_or_path, notes=()), "the student's shape (teacher unknown)"
