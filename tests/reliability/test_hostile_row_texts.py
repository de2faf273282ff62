"""Hostile `data.datasets[].texts` (preference and unpaired rows written with format strings): a placeholder
may name a column and index into it, nothing else. One that reads an attribute (Python's `{x.__class__}`),
starts with something other than a column name, carries a format spec or a conversion (a padding bomb such
as `{x:>999999999}`) or is malformed is refused by `validate` at its file and line (exit 2), before any row
is read; a texts section on a format that has no prompt and answers is refused too."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile_testing import assert_refused, run_inprocess

ROOT = Path(__file__).resolve().parents[2]
DPO = ROOT / "examples" / "yaml" / "tiny" / "dpo.yaml"
DATA = ROOT / "examples" / "data" / "preference.jsonl"


def _recipe(tmp_path: Path, texts: str, fmt: str = "preference") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"extends: {DPO}\ndata:\n  datasets:\n    - path: {DATA}\n      format: {fmt}\n"
                    f"      texts:\n{texts}")
    return path


@pytest.mark.parametrize("line, message", [
    ('        prompt: "{prompt.__class__.__init__.__globals__}"\n', "reads an attribute"),
    ('        chosen: "{chosen[0].__class__}"\n', "reads an attribute"),
    ('        prompt: "{0}"\n', "does not start with a column name"),
    ('        prompt: "{}"\n', "does not start with a column name"),
    ('        rejected: "{rejected:>999999999}"\n', "format spec or conversion"),
    ('        prompt: "{prompt!r}"\n', "format spec or conversion"),
    ('        prompt: "{prompt"\n', "write a literal brace"),
], ids=["attribute-chain", "attribute-after-index", "positional", "empty", "padding-bomb", "conversion",
        "unclosed"])
def test_a_placeholder_that_is_not_a_column_is_refused_at_its_line(tmp_path, capsys, line, message):
    path = _recipe(tmp_path, line)
    code, _, err = run_inprocess(capsys, ["validate", str(path)])
    assert_refused(code, err, f"{path}:7", message)


def test_texts_on_a_format_without_answers_is_refused(tmp_path, capsys):
    path = _recipe(tmp_path, '        prompt: "{prompt}"\n', fmt="messages")
    code, _, err = run_inprocess(capsys, ["validate", str(path)])
    assert_refused(code, err, f"{path}:", "`texts` needs format: preference or unpaired")


def test_column_placeholders_with_indexes_validate(tmp_path, capsys):
    path = _recipe(tmp_path, '        prompt: "<|user|>{prompt}<|end|>"\n        chosen: "{chosen}<|end|>"\n')
    code, _, err = run_inprocess(capsys, ["validate", str(path)])
    assert code == 0, err
