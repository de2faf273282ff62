"""`stage: distill`: what validate refuses (at the key) and the teacher/student tokenizer comparison."""

import json

import pytest

from recipeforge.components.vocab_files import first_difference, read_vocab
from recipeforge.config import load_recipe
from recipeforge.config.schema.stage_recipes import DistillRecipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL

DISTILL = MINIMAL.replace("sft", "distill")


def problems(write, text, *overrides):
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", text), list(overrides))
    return {p.key: p for p in exc.value.problems}


def _tokenizer(path, vocab, added=()):
    path.mkdir(parents=True)
    (path / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": vocab},
        "added_tokens": [{"id": i, "content": t} for t, i in added]}))
    return path


def test_a_colocated_teacher_loads(write):
    r = load_recipe(write("r.yaml", DISTILL + "distill: {teacher: {name_or_path: runs/t/final}}\n")).recipe
    assert isinstance(r, DistillRecipe) and r.distill.top_k == 20 and r.distill.loss == "forward_kl"


def test_on_policy_with_packing_is_refused_at_on_policy(write):
    ps = problems(write, DISTILL + "distill: {teacher: {name_or_path: t}, on_policy: 0.5}\n", "data.packing=true")
    assert "packed rows" in ps["distill.on_policy"].message and ps["distill.on_policy"].location.line == 7
    assert ps["distill.on_policy"].hint == "set data.packing: false"


def test_a_served_teacher_only_at_temperature_one(write):
    ps = problems(write, DISTILL + "distill: {teacher: {url: 'http://h:8000/v1'}, temperature: 2.0}\n")
    assert "temperature 1" in ps["distill.temperature"].message
    load_recipe(write("ok.yaml", DISTILL + "distill: {teacher: {url: 'http://h:8000/v1'}}\n"))


def test_on_policy_with_fp8_and_a_4bit_teacher_on_cpu_are_refused(write):
    ps = problems(write, DISTILL + "distill: {teacher: {name_or_path: t, load_in_4bit: true}, on_policy: 0.2}\n"
                  "hardware: {gpus_per_node: 0}\n", "train.precision=fp8", "model.dtype=bf16")
    assert "multiples of 16" in ps["distill.on_policy"].message
    assert "CUDA" in ps["distill.teacher.load_in_4bit"].message


def test_different_local_tokenizers_are_refused_naming_the_first_difference(write, tmp_path):
    student = _tokenizer(tmp_path / "student", {"a": 0, "b": 1, "c": 2})
    teacher = _tokenizer(tmp_path / "teacher", {"a": 0, "c": 1, "b": 2})
    text = DISTILL.replace("tiny:llama", str(student)) + f"distill: {{teacher: {{name_or_path: {teacher}}}}}\n"
    p = problems(write, text)["distill.teacher.name_or_path"]
    assert "token id 1 is 'b' for the student and 'c' for the teacher" in p.message
    same = _tokenizer(tmp_path / "same", {"a": 0, "b": 1, "c": 2})
    load_recipe(write("ok.yaml", text.replace(str(teacher), str(same))))


def test_vocabularies_from_files():
    assert first_difference({"a": 0}, {"a": 0}) is None
    assert "2 tokens" in first_difference({"a": 0, "b": 1}, {"a": 0})


def test_read_vocab_takes_added_tokens_and_vocab_json(tmp_path):
    d = _tokenizer(tmp_path / "t", {"a": 0}, added=[("<eos>", 1)])
    assert read_vocab(d) == {"a": 0, "<eos>": 1}
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "vocab.json").write_text(json.dumps({"x": 0}))
    (tmp_path / "v" / "added_tokens.json").write_text(json.dumps({"<pad>": 1}))
    assert read_vocab(tmp_path / "v") == {"x": 0, "<pad>": 1}
    assert read_vocab(tmp_path / "missing") is None
