"""`distill:` — knowledge distillation: a student (the recipe's `model:`) learns a teacher's next-token
distributions.

The teacher is loaded in the run (`teacher.name_or_path`: colocated, frozen, optionally 4-bit) or
asked over HTTP (`teacher.url`: an OpenAI-compatible completions server that returns prompt
log-probs, as vLLM's and `recipeforge serve`'s do). Either way the loss compares the student with
the teacher's `top_k` most likely tokens at each completion position, plus one bucket for the rest
of the vocabulary, so a served teacher (which only sends its top tokens) and a colocated one train
the same objective.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from recipeforge.config.schema.base import Section

Divergence = Literal["forward_kl", "reverse_kl", "jsd"]


class TeacherConfig(Section):
    """The teacher: a model loaded in the run, or a server that scores the student's sequences."""

    name_or_path: Optional[str] = Field(
        None, min_length=1,
        description="Colocated teacher: a local directory, a hub id or a run's `final/` (loaded frozen, in eval "
                    "mode, on each training process). Exactly one of `name_or_path` and `url`.")
    revision: Optional[str] = Field(None, description="Hub revision of a colocated teacher.")
    load_in_4bit: bool = Field(
        False, description="Load a colocated teacher 4-bit (bitsandbytes NF4, CUDA only): a teacher several times "
                           "the student's size fits beside it.")
    url: Optional[str] = Field(
        None, min_length=1,
        description="Served teacher: base URL of an OpenAI-compatible server that returns prompt log-probs for "
                    "token-id prompts (`vllm serve`, or `recipeforge serve` of the teacher run), e.g. "
                    "http://127.0.0.1:8000/v1. Nothing of the teacher is held on the training GPUs.")
    served_model: Optional[str] = Field(
        None, min_length=1, description="Model name to send to a served teacher (default: the one it lists first).")
    api_key_env: Optional[str] = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable that holds the served teacher's API key (the key itself "
                    "never goes in a recipe).")
    timeout_s: float = Field(60.0, gt=0, description="Seconds to wait for one scoring request of a served teacher.")

    @model_validator(mode="after")
    def _one_teacher(self) -> TeacherConfig:
        if (self.name_or_path is None) == (self.url is None):
            raise ValueError("give the teacher either `name_or_path` (a model loaded in the run) or `url` (a served "
                             "teacher), not both and not neither")
        if self.url is not None and (self.load_in_4bit or self.revision is not None):
            raise ValueError("`load_in_4bit` and `revision` describe a colocated teacher; a served teacher (`url`) "
                             "is loaded by its server")
        return self


class DistillConfig(Section):
    """Knowledge distillation: the loss is `sft_weight` x cross-entropy on the dataset's completions plus
    (1 - `sft_weight`) x the divergence between teacher and student over the teacher's top-k tokens."""

    teacher: TeacherConfig = Field(description="The teacher model or server.")
    loss: Divergence = Field(
        "forward_kl", description="Divergence: `forward_kl` KL(teacher||student) (mode covering, the classic "
                                  "Hinton loss), `reverse_kl` KL(student||teacher) (mode seeking, MiniLLM), or `jsd` "
                                  "(generalized Jensen-Shannon with `beta`, GKD).")
    beta: float = Field(0.5, gt=0, lt=1, description="`jsd` only: the mixture weight of the generalized JSD "
                                                     "(0.5 is the symmetric JSD).")
    top_k: int = Field(
        20, ge=1, le=1024,
        description="Teacher tokens compared per position; the rest of the vocabulary is one bucket. 20 is what "
                    "vLLM returns without raising its `max_logprobs`, and usually holds nearly all of a trained "
                    "teacher's probability mass (each step logs the share held, `distill/teacher_mass`: raise k when "
                    "it is low).")
    temperature: float = Field(1.0, gt=0, description="Softmax temperature applied to both teacher and student "
                                                      "logits in the divergence.")
    sft_weight: float = Field(0.0, ge=0, le=1, description="Weight of the cross-entropy loss on the dataset's "
                                                          "completions (0: distillation alone).")
    on_policy: float = Field(
        0.0, ge=0, le=1,
        description="Share of steps whose completions the student samples itself from the rows' prompts before the "
                    "teacher scores them (GKD's lambda). 0: off-policy, the dataset's completions only.")
    max_new_tokens: int = Field(128, gt=0, description="On-policy steps: tokens the student samples per prompt.")
    sampling_temperature: float = Field(1.0, gt=0, description="On-policy steps: the student's sampling temperature.")
