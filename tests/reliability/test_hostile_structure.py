"""Hostile recipe structure: whatever the shape of a recipe file, a ``key=value`` override or a
``RECIPEFORGE_*`` variable, recipeforge answers with a located user error (exit 2), never with a
RecursionError, a hang or an internal error.

Covers nesting depth, aliases that contain themselves, ``${...}`` chains, cycles and expansion bombs,
huge numbers, NaN/inf, very long strings, bytes that are not UTF-8 and control characters.
"""

from __future__ import annotations

import pytest

from hostile_testing import OK, assert_refused, run_inprocess, run_process, write_files


def deep_block(levels: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(levels)) + "  " * levels + "v: 1\n"


def alias_chain(levels: int) -> str:
    # Each anchor nests the one before it: deep data from shallow text.
    return "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, levels))


def file_case(id, text, where, message):
    return pytest.param(text, where, message, id=id)


FILE_CASES = [
    # -- nesting depth (block and flow, mappings and lists, through aliases)
    file_case("deep-block-mapping-1000", deep_block(1000), "r.yaml:33:", "nesting deeper than 32 levels"),
    file_case("deep-block-mapping-33", deep_block(33), "r.yaml:33:", "nesting deeper than 32 levels"),
    file_case("deep-flow-list", OK + "name: " + "[" * 1000 + "]" * 1000 + "\n", "r.yaml:8:",
              "nesting deeper than 32 levels"),
    file_case("deep-flow-mapping", OK + "name: " + "{a: " * 500 + "1" + "}" * 500 + "\n", "r.yaml:8:",
              "nesting deeper than 32 levels"),
    file_case("deep-list-of-lists-block", OK + "name:\n" + "".join("  " * i + "-\n" for i in range(40)) +
              "  " * 40 + "- x\n", "r.yaml:", "nesting deeper than 32 levels"),
    file_case("deep-mixed", OK + "train: " + "[{a: " * 300 + "1" + "}]" * 300 + "\n", "r.yaml:8:",
              "nesting deeper than 32 levels"),
    file_case("deep-through-aliases", OK + alias_chain(40), "r.yaml:", "nesting deeper than 32 levels"),
    # -- aliases that contain themselves
    file_case("recursive-alias-list", OK + "name: &a [*a]\n", "r.yaml:8:11", "recursive alias *a"),
    file_case("recursive-alias-mapping", OK + "name: &a {x: *a}\n", "r.yaml:8:14", "recursive alias *a"),
    file_case("recursive-alias-nested", OK + "name: &a [[1, [*a]]]\n", "r.yaml:8:", "recursive alias *a"),
    file_case("recursive-alias-merge-key", OK + "train: &t\n  <<: *t\n", "r.yaml:9:7", "recursive alias *t"),
    file_case("recursive-alias-block", OK + "data2: &d\n  x:\n    - *d\n", "r.yaml:10:7", "recursive alias *d"),
    file_case("recursive-alias-top-level-key", "&root\nstage: sft\nself: *root\n", "r.yaml:3:7",
              "recursive alias *root"),
    # -- ${...}: cycles, chains, expansion, resolvers
    file_case("interp-self", OK + "name: ${name}\n", "r.yaml:8:1", "interpolation refers to itself: name -> name"),
    file_case("interp-two-cycle", OK + "name: ${description}\ndescription: ${name}\n", "r.yaml:8:1",
              "interpolation refers to itself"),
    file_case("interp-long-cycle", OK + "name: ${train.k0}\ntrain:\n" +
              "".join(f"  k{i}: ${{train.k{(i + 1) % 500}}}\n" for i in range(500)), "r.yaml:8:1",
              "interpolation chain longer than 16"),
    file_case("interp-short-cycle-in-lists", OK + "name: ${train.a[0]}\ntrain:\n  a: ['${train.b[0]}']\n"
              "  b: ['${name}']\n", "r.yaml:8:1", "interpolation refers to itself"),
    file_case("interp-chain-1000", OK + "name: ${train.k0}\ntrain:\n" +
              "".join(f"  k{i}: ${{train.k{i + 1}}}\n" for i in range(1000)) + "  k1000: end\n", "r.yaml:8:1",
              "interpolation chain longer than 16"),
    file_case("interp-relative-cycle", OK + "train:\n  a: ${.b}\n  b: ${.a}\n", "r.yaml:9:3",
              "interpolation refers to itself"),
    file_case("interp-expansion-bomb", OK + "description: " + "x" * 100 + "\ntrain:\n  a: " + "${description}" * 200
              + "\n  b: " + "${train.a}" * 200 + "\n  c: " + "${train.b}" * 200 + "\nname: ${train.c}\n",
              "r.yaml:", "interpolation expands to more than 100000 characters"),
    file_case("interp-section-bomb", OK + "c:\n  a: " + "y" * 2000 + "\nname: " + "${c}" * 100 + "\n",
              "r.yaml:10:1 name", "interpolation expands to more than 100000 characters"),
    file_case("interp-oc-env", OK + "name: ${oc.env:HOME}\n", "r.yaml:8:1", "unknown resolver 'oc.env'"),
    file_case("interp-oc-decode", OK + "name: ${oc.decode:'[1]'}\n", "r.yaml:8:1", "unknown resolver 'oc.decode'"),
    file_case("interp-nested-oc-env", OK + "name: ${env:${oc.env:HOME}}\n", "r.yaml:8:1", "unknown resolver 'oc.env'"),
    # -- numbers
    file_case("huge-int-26-digits", OK + "train: {max_steps: 99999999999999999999999999}\n", "r.yaml:8:20",
              "integer too large"),
    file_case("huge-int-5000-digits", OK + "train: {seed: " + "9" * 5000 + "}\n", "r.yaml:8:15", "integer too large"),
    file_case("huge-negative-int", OK + "train: {seed: -99999999999999999999}\n", "r.yaml:8:15",
              "integer too large"),
    file_case("huge-hex-int", OK + "train: {seed: 0x" + "f" * 40 + "}\n", "r.yaml:8:15", "integer too large"),
    file_case("int-2-pow-63", OK + "train: {max_steps: 9223372036854775808}\n", "r.yaml:8:20", "integer too large"),
    file_case("float-overflow", OK + "train: {weight_decay: 1.0e+400}\n", "r.yaml:8:23", "not a finite number"),
    file_case("nan", OK + "train: {weight_decay: .nan}\n", "r.yaml:8:23", "'.nan' is not a finite number"),
    file_case("nan-uppercase", OK + "train: {max_grad_norm: .NaN}\n", "r.yaml:8:24", "not a finite number"),
    file_case("inf", OK + "train: {max_grad_norm: .inf}\n", "r.yaml:8:24", "'.inf' is not a finite number"),
    file_case("negative-inf", OK + "adapter: {dropout: -.inf}\n", "r.yaml:8:20", "not a finite number"),
    file_case("nan-in-list", OK + "name: [1, .nan]\n", "r.yaml:8:11", "not a finite number"),
    # -- text
    file_case("very-long-string", OK + "description: " + "x" * 200_000 + "\n", "r.yaml:8:14",
              "value of 200000 characters"),
    file_case("very-long-key", OK + "k" * 500 + ": 1\n", "r.yaml:8:1", "keys are short names"),
    file_case("lone-surrogate-escape", OK + 'name: "\\ud800"\n', "r.yaml:8:7", "lone surrogate"),
    file_case("surrogate-key", OK + '"\\udfff": 1\n', "r.yaml:8:1", "keys are short names"),
    file_case("control-character", OK + "name: a\x01b\n", "r.yaml:8:8", "control character '\\x01'"),
    file_case("nul-byte", OK + "name: a\x00b\n", "r.yaml:8:8", "control character '\\x00'"),
    file_case("escape-sequence", OK + "name: \x1b[31mred\n", "r.yaml:8:7", "control character '\\x1b'"),
]


@pytest.mark.parametrize("text, where, message", FILE_CASES)
def test_hostile_recipe_file(tmp_path, monkeypatch, capsys, text, where, message):
    write_files(tmp_path, {"r.yaml": text})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, where, message)
    assert len(err) < 10_000  # a bounded report, however big the input


@pytest.mark.parametrize("raw, line_col", [
    (b"stage: sft\nname: caf\xe9\n", "r.yaml:2:10"),
    (b"stage: sft\nmodel:\n  name_or_path: \xff\xfe\n", "r.yaml:3:17"),
    (b"\xc3\x28: 1\n", "r.yaml:1:1"),
])
def test_non_utf8_file_is_located(tmp_path, monkeypatch, capsys, raw, line_col):
    write_files(tmp_path, {"r.yaml": raw})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, line_col, "not UTF-8 text")


OVERRIDE_CASES = [
    pytest.param("train.learning_rate=&a [*a]", "recursive alias *a", id="recursive-alias"),
    pytest.param("train.learning_rate=&a {x: [*a]}", "recursive alias *a", id="recursive-alias-mapping"),
    pytest.param("name=" + "[" * 500 + "]" * 500, "nesting deeper than 32 levels", id="deep-flow"),
    pytest.param("k" + ".k" * 40 + "=1", "nesting deeper than 32 levels", id="deep-key-path"),
    pytest.param("train.x" + ".k" * 20 + "=" + "[" * 20 + "]" * 20, "nesting deeper than 32 levels",
                 id="deep-key-plus-value"),
    pytest.param("train.max_steps=99999999999999999999999999", "integer too large", id="huge-int"),
    pytest.param("train.seed=" + "1" * 5000, "integer too large", id="huge-int-5000-digits"),
    pytest.param("train.weight_decay=.nan", "not a finite number", id="nan"),
    pytest.param("train.max_grad_norm=.inf", "not a finite number", id="inf"),
    pytest.param("train.max_grad_norm=-1.0e+999", "not a finite number", id="float-overflow"),
    pytest.param("train.max_grad_norm=1e999", "should be a finite number", id="number-text-overflow"),
    pytest.param("hardware.cpu_ram_gb='1e999'", "should be a finite number", id="inf-as-quoted-text"),
    pytest.param("train.max_grad_norm=Infinity", "should be a finite number", id="infinity-as-text"),
    pytest.param("description=" + "x" * 150_000, "value of 150000 characters", id="long-string"),
    pytest.param("name=a\x01b", "control character", id="control-character"),
    pytest.param('name="\\udc80"', "lone surrogate", id="surrogate-escape"),
    pytest.param("name=caf\udce9", "not UTF-8 text", id="non-utf8-bytes"),
    pytest.param("name=a: 1\n---\nb: 2", "one YAML document", id="multi-document"),
    pytest.param("name=!!python/object/apply:os.system [ls]", "refusing Python tag", id="python-tag"),
]


@pytest.mark.parametrize("arg, message", OVERRIDE_CASES)
def test_hostile_cli_override(tmp_path, monkeypatch, capsys, arg, message):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml", arg])
    assert_refused(code, err, "<cli ", message)
    assert len(err.splitlines()[0]) < 400


@pytest.mark.parametrize("name, value, message", [
    ("RECIPEFORGE_TRAIN__LEARNING_RATE", "&a [*a]", "recursive alias *a"),
    ("RECIPEFORGE_TRAIN__SEED", "[" * 100 + "]" * 100, "nesting deeper than 32 levels"),
    ("RECIPEFORGE_TRAIN" + "__K" * 40, "1", "nesting deeper than 32 levels"),
    ("RECIPEFORGE_TRAIN__MAX_STEPS", "99999999999999999999999999", "integer too large"),
    ("RECIPEFORGE_TRAIN__WEIGHT_DECAY", ".nan", "not a finite number"),
    ("RECIPEFORGE_TRAIN__MAX_GRAD_NORM", "-.Inf", "not a finite number"),
    ("RECIPEFORGE_DESCRIPTION", "caf\udce9", "not UTF-8 text"),
    ("RECIPEFORGE_DESCRIPTION", "y" * 120_000, "value of 120000 characters"),
], ids=["recursive-alias", "deep-value", "deep-name", "huge-int", "nan", "inf", "non-utf8", "long-string"])
def test_hostile_env_override(tmp_path, monkeypatch, capsys, name, value, message):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    code, _, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, f"<env {name[:40]}", message)


def test_secret_from_non_utf8_variable_is_a_user_error(tmp_path, monkeypatch, capsys):
    write_files(tmp_path, {"r.yaml": OK + "description: ${env:RF_TEST_LATIN}\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RF_TEST_LATIN", "caf\udce9")
    code, _, err = run_inprocess(capsys, ["resolve", "r.yaml"])
    assert_refused(code, err, "r.yaml:8:1 description", "RF_TEST_LATIN is not UTF-8 text")


# A representative subset through a real process: the shell's bytes, the interpreter's recursion
# limit and the exit code as a user sees them.
PROCESS_CASES = [
    pytest.param({"r.yaml": deep_block(1000)}, ["validate", "r.yaml"], {}, "r.yaml:33:", "nesting deeper",
                 id="deep-file"),
    pytest.param({"r.yaml": OK + "name: &a [*a]\n"}, ["resolve", "r.yaml"], {}, "r.yaml:8:11", "recursive alias",
                 id="recursive-alias-file"),
    pytest.param({"r.yaml": OK}, ["validate", "r.yaml", "train.learning_rate=&a [*a]"], {},
                 "<cli train.learning_rate=&a [*a]>", "recursive alias", id="recursive-alias-cli"),
    pytest.param({"r.yaml": OK}, ["plan", "r.yaml"], {"RECIPEFORGE_TRAIN__LEARNING_RATE": "&a [*a]"},
                 "<env RECIPEFORGE_TRAIN__LEARNING_RATE>", "recursive alias", id="recursive-alias-env"),
    pytest.param({"r.yaml": OK}, ["validate", "r.yaml", "train.max_steps=99999999999999999999999999"], {},
                 "<cli train.max_steps=", "integer too large", id="huge-int-cli"),
    pytest.param({"r.yaml": OK}, ["resolve", "r.yaml", b"name=caf\xe9"], {}, "<cli name=caf", "not UTF-8 text",
                 id="non-utf8-argv"),
    pytest.param({"r.yaml": OK + "name: ${train.k0}\ntrain:\n" + "".join(
        f"  k{i}: ${{train.k{i + 1}}}\n" for i in range(1000)) + "  k1000: end\n"}, ["validate", "r.yaml"], {},
        "r.yaml:8:1 name", "interpolation chain longer than 16", id="interp-chain"),
    pytest.param({"r.yaml": OK + "train: {max_grad_norm: .inf}\n"}, ["plan", "r.yaml"], {}, "r.yaml:8:24",
                 "not a finite number", id="inf-plan"),
    pytest.param({"r.yaml": b"stage: sft\nname: caf\xe9\n"}, ["train", "r.yaml"], {}, "r.yaml:2:10",
                 "not UTF-8 text", id="non-utf8-train"),
]


@pytest.mark.parametrize("files, args, env, where, message", PROCESS_CASES)
def test_hostile_structure_through_the_cli(tmp_path, files, args, env, where, message):
    write_files(tmp_path, files)
    code, out, err = run_process(tmp_path, args, env)
    assert_refused(code, err, where, message)
    assert out == ""
