"""Every name a run looks up is checked by `validate`: an unknown one is a located error (file:line,
the key) with a did-you-mean hint, never something that validates and fails (or is ignored) later."""

from __future__ import annotations

import pytest

from recipeforge.cli import main
from recipeforge.config import load_recipe
from recipeforge.config.validate import check_components
from recipeforge.errors import RecipeError

SFT = """\
stage: sft
model:
  name_or_path: {model}
  attn_implementation: {attn}
data:
  datasets: [{{path: d.jsonl, format: {fmt}}}]
  chat_template: {template}
train:
  optimizer: {optimizer}
  scheduler: {scheduler}
distributed:
  backend: {backend}
  preset: {preset}
kernels: [{kernel}]
"""
GRPO = """\
stage: grpo
model: {{name_or_path: tiny:llama}}
data:
  datasets: [{{path: d.jsonl, format: prompt}}]
grpo:
  rewards: [{{name: {reward}}}]
  rollout: {{engine: {engine}}}
"""
GOOD_SFT = dict(model="tiny:llama", attn="sdpa", fmt="alpaca", template="chatml", optimizer="adamw",
                scheduler="cosine", backend="deepspeed", preset="zero2", kernel="torch_compile")
GOOD_GRPO = dict(reward="length", engine="hf")

CASES = [  # (recipe, field, bad name, key, line, suggestion)
    (SFT, "model", "tiny:llamma", "model.name_or_path", 3, "tiny:llama"),
    (SFT, "attn", "sdpaa", "model.attn_implementation", 4, "sdpa"),
    (SFT, "fmt", "alpacca", "data.datasets[0].format", 6, "alpaca"),
    (SFT, "template", "chatmll", "data.chat_template", 7, "chatml"),
    (SFT, "optimizer", "adamww", "train.optimizer", 9, "adamw"),
    (SFT, "scheduler", "cosinee", "train.scheduler", 10, "cosine"),
    (SFT, "backend", "deepspeedd", "distributed.backend", 12, "deepspeed"),
    (SFT, "preset", "zero22", "distributed.preset", 13, "zero2"),
    (SFT, "kernel", "torch_compil", "kernels.torch_compil", 14, "torch_compile"),
    (GRPO, "reward", "lenght", "grpo.rewards[0].name", 6, "length"),
    (GRPO, "engine", "hff", "grpo.rollout.engine", 7, "hf"),
]


def _write(tmp_path, template: str, field: str, bad: str):
    good = GOOD_SFT if template is SFT else GOOD_GRPO
    path = tmp_path / "r.yaml"
    path.write_text(template.format(**{**good, field: bad}))
    return path


@pytest.mark.parametrize("template", [SFT, GRPO], ids=["sft", "grpo"])
def test_the_good_names_validate(tmp_path, template):
    loaded = load_recipe(_write(tmp_path, template, "model" if template is SFT else "reward",
                                "tiny:llama" if template is SFT else "length"))
    check_components(loaded)


@pytest.mark.parametrize("template, field, bad, key, line, suggestion", CASES, ids=[c[1] for c in CASES])
def test_unknown_name_is_located_with_a_suggestion(tmp_path, template, field, bad, key, line, suggestion):
    path = _write(tmp_path, template, field, bad)
    with pytest.raises(RecipeError) as info:
        check_components(load_recipe(path))
    problems = [p for p in info.value.problems if p.key == key]
    assert problems, f"no problem at {key}: {info.value.render()}"
    p = problems[0]
    assert p.location is not None and p.location.line == line
    assert f"did you mean '{suggestion}'?" in (p.hint or "")


CLI_CASES = [c for c in CASES if c[1] in ("template", "model", "preset", "reward", "kernel")]


@pytest.mark.parametrize("template, field, bad, key, line, suggestion", CLI_CASES, ids=[c[1] for c in CLI_CASES])
def test_validate_exits_2_with_file_line_and_suggestion(tmp_path, capsys, template, field, bad, key, line,
                                                        suggestion):
    path = _write(tmp_path, template, field, bad)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"r.yaml:{line}:" in err and f"{key}:" in err and f"did you mean '{suggestion}'?" in err
    assert "Traceback" not in err
