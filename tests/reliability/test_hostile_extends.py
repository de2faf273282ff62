"""`extends:` never quotes the file it names, and no message quotes more than a short excerpt.

A parent that is not a recipe (a system file, another tool's YAML, a binary) is refused in one error
at the `extends` entry, without a line of its contents. Messages about any value, key or source
quote at most `MAX_EXCERPT` characters of it, with control characters escaped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hostile_testing import OK, assert_refused, run_inprocess, run_process, write_files
from recipeforge.errors import MAX_EXCERPT

# What a non-recipe file holds, with a value that must never be printed.
LEAK = "hunter2-LEAKED-VALUE"
SYSTEM_LIKE = "".join(f"user{i}: x:{i}:{i}:{LEAK}:/home/user{i}:/bin/sh\n" for i in range(30))


def ext(id, parent, where="r.yaml:8:1 extends", message="is not a recipe", extends="p.yaml"):
    files = {"r.yaml": OK + f"extends: {extends}\n"}
    if parent is not None:
        files["p.yaml"] = parent
    return pytest.param(files, where, message, id=id)


CASES = [
    ext("mapping-of-unknown-keys", SYSTEM_LIKE),
    ext("a-few-unknown-keys", f"root: {LEAK}\ndaemon: {LEAK}\n"),
    ext("one-unknown-key", f"password: {LEAK}\n"),
    ext("mostly-unknown-with-a-recipe-key", "stage: sft\n" + SYSTEM_LIKE),
    ext("plain-text-lines", "".join(f"{LEAK} line {i}\n" for i in range(50))),
    ext("passwd-format", "".join(f"user{i}:x:{i}:{i}:{LEAK}:/home:/bin/sh\n" for i in range(20))),
    ext("list", f"- {LEAK}\n- b\n"),
    ext("scalar", f"{LEAK}\n"),
    ext("json-object", '{"' + LEAK + '": 1, "other": 2, "more": 3, "x": 4}\n'),
    ext("ini-file", f"[section]\nkey = {LEAK}\nother = 1\n", message="YAML syntax error"),
    ext("env-file", f"DB_PASSWORD={LEAK}\nAPI_KEY={LEAK}\n"),
    ext("duplicate-keys-everywhere", "".join(f"k: {LEAK}\n" for _ in range(40))),
    ext("binary", b"\x7fELF\x02\x01\x01\x00" + LEAK.encode() + b"\xff\xfe\x00", message="not UTF-8 text"),
    ext("too-big", "a: " + "x" * 2_100_000 + "\n", message="a recipe may be at most"),
    ext("syntax-error", f"a: [{LEAK}\n", message="YAML syntax error"),
    ext("python-tag", "stage: !!python/object/apply:os.system [ls]\n", message="refusing Python tag"),
    ext("recursive-alias", "stage: sft\nname: &a [*a]\n", message="recursive alias"),
    ext("deep-nesting", "stage: sft\nname: " + "[" * 100 + "]" * 100 + "\n", message="nesting deeper"),
    ext("directory", None, extends="/tmp", message="extended recipe is not a file"),
    ext("device", None, extends="/dev/null", message="extended recipe is not a file"),
    ext("etc-passwd", None, extends="/etc/passwd"),
    ext("etc-hostname-or-hosts", None, extends="/etc/hosts"),
    pytest.param({"r.yaml": OK + "extends: [base.yaml, p.yaml]\n", "base.yaml": "train: {seed: 3}\n",
                  "p.yaml": SYSTEM_LIKE}, "r.yaml:8:22 extends", "is not a recipe", id="second-of-a-list"),
    pytest.param({"r.yaml": OK + "extends: mid.yaml\n", "mid.yaml": "train: {seed: 3}\nextends: p.yaml\n",
                  "p.yaml": SYSTEM_LIKE}, "mid.yaml:2:1 extends", "is not a recipe", id="grandparent"),
]


@pytest.mark.parametrize("files, where, message", CASES)
def test_extends_a_file_that_is_not_a_recipe(tmp_path, monkeypatch, capsys, files, where, message):
    write_files(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, where, message)
    assert LEAK not in out + err
    # One problem, whatever the file holds.
    assert "problems:" not in err
    assert len(err.splitlines()) <= 2


def test_etc_passwd_contents_never_printed(tmp_path, monkeypatch, capsys):
    lines = [line for line in Path("/etc/passwd").read_text().splitlines() if line.strip()]
    write_files(tmp_path, {"r.yaml": OK + "extends: /etc/passwd\n"})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, "r.yaml:8:1 extends", "/etc/passwd is not a recipe")
    assert not any(line in err for line in lines)


@pytest.mark.parametrize("command", ["validate", "resolve", "plan"])
def test_extends_refusal_through_the_cli(tmp_path, command):
    write_files(tmp_path, {"r.yaml": OK + "extends: p.yaml\n", "p.yaml": SYSTEM_LIKE})
    code, out, err = run_process(tmp_path, [command, "r.yaml"])
    assert_refused(code, err, "r.yaml:8:1 extends", "p.yaml is not a recipe")
    assert LEAK not in out + err


def test_parent_with_a_typo_still_gets_the_usual_hint(tmp_path, monkeypatch, capsys):
    # A real parent recipe with one misspelt section is a recipe: its typo is reported at its line.
    write_files(tmp_path, {"r.yaml": OK + "extends: p.yaml\n", "p.yaml": "stage: sft\ntrian: {seed: 1}\n"})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, "p.yaml:2:1 trian", "unknown key 'trian'")
    assert "did you mean 'train'?" in err


# -- every message quotes at most a short, escaped excerpt of a user value
LONG = "Q" * 5000
BOUNDED = [
    pytest.param(OK + f"train: {{seed: {LONG}}}\n", [], id="wrong-type-value"),
    pytest.param(OK + f"{LONG}: 1\n", [], id="very-long-key-name"),
    pytest.param(OK + f"{LONG[:150]}: 1\n", [], id="unknown-key-name"),
    pytest.param(OK.replace("stage: sft", f"stage: {LONG}"), [], id="bad-enum-value"),
    pytest.param(OK, [f"train.seed={LONG}"], id="cli-value"),
    pytest.param(OK, [f"{LONG}=1"], id="cli-key"),
    pytest.param(OK, [f"~{LONG}"], id="cli-delete"),
    pytest.param(OK + f"name: ${{{LONG}}}\n", [], id="interpolation"),
    pytest.param(OK + f"name: ${{train.seed\n", [], id="interpolation-syntax"),
    pytest.param(OK + f"extends: {LONG}.yaml\n", [], id="extends-path"),
]


@pytest.mark.parametrize("text, overrides", BOUNDED)
def test_messages_quote_short_excerpts(tmp_path, monkeypatch, capsys, text, overrides):
    write_files(tmp_path, {"r.yaml": text.replace("${train.seed\n", "${train.seed" + LONG + "\n")})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml", *overrides])
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err
    assert max((len(run) for run in re.findall("Q+", err)), default=0) <= MAX_EXCERPT, err[:2000]


@pytest.mark.parametrize("value, shown", [
    ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),
    ("a\rb", "a\\rb"),
    ("bell\x07", "bell\\x07"),
    ("a\u202eb", "a\\u202eb"),  # right-to-left override: would reorder what the terminal shows
])
def test_control_characters_in_values_are_escaped(tmp_path, monkeypatch, capsys, value, shown):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml", f"train.seed={value}"])
    assert code == 2
    assert value not in err and shown in err, err
