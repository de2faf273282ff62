"""Safe YAML parsing with provenance."""

import pytest

from recipeforge.config.load import MAX_NODES, load_yaml_file, load_yaml_text
from recipeforge.errors import RecipeError


def test_every_key_has_its_line_and_column():
    tree = load_yaml_text("stage: sft\nmodel:\n  name_or_path: x\ndata:\n  datasets:\n    - {path: a, format: text}\n", "r.yaml")
    assert tree.data["model"]["name_or_path"] == "x"
    loc = tree.prov[("model", "name_or_path")]
    assert (loc.file, loc.line, loc.col) == ("r.yaml", 3, 3)
    item = tree.prov[("data", "datasets", 0, "format")]
    assert (item.line, item.col) == (6, 17)


def test_python_tags_are_refused_without_running_code(tmp_path):
    marker = tmp_path / "ran"
    text = f"stage: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(RecipeError) as exc:
        load_yaml_text(text, "evil.yaml")
    problem = exc.value.problems[0]
    assert "refusing Python tag !!python/object/apply:os.system" in problem.message
    assert (problem.location.line, problem.location.col) == (1, 8)
    assert not marker.exists()


def test_custom_tags_are_refused():
    with pytest.raises(RecipeError, match="unsupported YAML tag '!include'"):
        load_yaml_text("a: !include other.yaml\n", "r.yaml")


def test_alias_bomb_is_refused():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefg"):
        prev = "abcdefg"[i]
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(RecipeError) as exc:
        load_yaml_text("\n".join(lines) + "\n", "bomb.yaml")
    assert f"more than {MAX_NODES} nodes" in exc.value.problems[0].message


def test_small_anchors_and_merge_keys_work():
    tree = load_yaml_text("base: &b {r: 8, alpha: 16}\nadapter:\n  <<: *b\n  r: 4\n", "r.yaml")
    assert tree.data["adapter"] == {"r": 4, "alpha": 16}


def test_duplicate_keys_are_errors_with_both_lines():
    with pytest.raises(RecipeError) as exc:
        load_yaml_text("train:\n  seed: 1\n  seed: 2\n", "r.yaml")
    p = exc.value.problems[0]
    assert p.key == "train.seed" and p.location.line == 3 and "first written at line 2" in p.message


def test_syntax_error_points_at_line():
    with pytest.raises(RecipeError) as exc:
        load_yaml_text("stage: sft\nmodel:\n  name_or_path: [oops\n", "bad.yaml")
    p = exc.value.problems[0]
    assert p.location.file == "bad.yaml" and p.location.line >= 3 and "YAML syntax error" in p.message


def test_non_mapping_root_and_non_string_keys():
    with pytest.raises(RecipeError, match="must be a mapping"):
        load_yaml_text("- a\n- b\n", "r.yaml")
    with pytest.raises(RecipeError, match="keys must be plain strings"):
        load_yaml_text("1: a\n", "r.yaml")


def test_missing_file_and_non_utf8(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_yaml_file(tmp_path / "nope.yaml")
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(RecipeError, match="not UTF-8"):
        load_yaml_file(bad)


def test_dates_stay_text():
    assert load_yaml_text("model: {revision: 2024-07-01}\n").data["model"]["revision"] == "2024-07-01"
