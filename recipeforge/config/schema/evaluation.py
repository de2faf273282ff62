"""`eval:` — benchmarks run on the finished model with EleutherAI's lm-evaluation-harness."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from recipeforge.config.schema.base import Section


class EvalConfig(Section):
    """Tasks `recipeforge eval` runs on final/ (a LoRA adapter on its base, unmerged), and whether `train` runs
    them once the run is saved. Results go to RUN_DIR/eval/<task>.json, the model card and `recipeforge report`.
    Needs lm-eval: pip install 'recipeforge[eval]'."""

    tasks: list[str] = Field(
        default_factory=list,
        description="lm-eval task names (e.g. arc_easy, hellaswag: their datasets come from the Hub), or local "
                    "tasks: a .jsonl file of {prompt, reference} rows (exact match of the greedy reply) or "
                    "{prompt, choices, answer} rows (multiple choice by loglikelihood), or an lm-eval task .yaml; "
                    "paths are relative to the recipe file.")
    after_training: bool = Field(
        True, description="Run the tasks at the end of `recipeforge train` (when `tasks` is not empty); a failed "
                          "evaluation leaves the run complete and is retried with `recipeforge eval RUN_DIR`.")
    at_checkpoints: bool = Field(
        False, description="With after_training: also evaluate every checkpoint still kept in RUN_DIR/checkpoints "
                           "(output.save_total_limit decides which; sharded DeepSpeed/FSDP checkpoints are skipped), "
                           "into eval/checkpoint-N/<task>.json. `recipeforge eval --checkpoints` does the same.")
    batch_size: Optional[int] = Field(
        None, gt=0,
        description="Prompts per forward pass (null: 8 on the CPU; on a GPU lm-eval's `auto`, which starts from "
                    "the largest batch and halves it on out-of-memory). `recipeforge eval --batch-size` overrides.")
    limit: Optional[int] = Field(None, gt=0, description="Evaluate only the first N examples of each task (null: all).")
    num_fewshot: Optional[int] = Field(None, ge=0, description="Few-shot examples per prompt (null: each task's own).")
    max_new_tokens: int = Field(
        32, gt=0, description="Longest greedy reply of a local {prompt, reference} task, in tokens (it stops at a "
                              "newline first).")
    apply_chat_template: bool = Field(
        False, description="Wrap each prompt in the run's chat template (lm-eval's --apply_chat_template).")

    @field_validator("tasks")
    @classmethod
    def _named(cls, value: list[str]) -> list[str]:
        if any(not t.strip() for t in value):
            raise ValueError("a task is an lm-eval task name or a path to a .jsonl or .yaml file, not empty")
        if len(set(value)) != len(value):
            raise ValueError("a task is listed twice")
        return value
