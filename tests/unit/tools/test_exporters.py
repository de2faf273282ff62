"""The parts of `recipeforge export` that need no model: format names and refusals, the output folder's
rules, the int4 group size, where the held texts come from, and the self-check's verdict."""

from __future__ import annotations

import pytest

from recipeforge.errors import RecipeError
from recipeforge.outputs.ownership import mark_owned
from recipeforge.tools.exporters.formats import (FORMAT_SPECS, FORMATS, ExportFormat, check_available, format_spec,
                                                  int4_group)
from recipeforge.tools.exporters.selfcheck import FIXED_TEXTS, Measure, compare, held_texts
from recipeforge.tools.exporters.source import check_output


def test_every_format_is_named_once_with_a_spec():
    assert set(FORMAT_SPECS) == set(ExportFormat) and len(set(FORMATS)) == len(FORMATS)
    assert format_spec("torchao-int8").name is ExportFormat.TORCHAO_INT8
    with pytest.raises(RecipeError, match="did you mean 'torchao-int4'"):
        format_spec("torchao_int4")


def test_gguf_is_refused_with_the_converter_command_for_this_run():
    with pytest.raises(RecipeError) as caught:
        check_available(format_spec("gguf-q8_0"), "runs/x")
    text = caught.value.render()
    assert "runs/x/export-safetensors --outtype q8_0" in text and "convert_hf_to_gguf.py" in text


def test_the_output_folder_never_replaces_data(tmp_path):
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    check_output(run, run / "export-x", overwrite=False)  # new folder
    (run / "export-x").mkdir()
    check_output(run, run / "export-x", overwrite=False)  # empty folder
    (run / "export-x" / "a").write_text("1")
    with pytest.raises(RecipeError, match="already holds files"):
        check_output(run, run / "export-x", overwrite=False)
    # --overwrite replaces only a folder recipeforge wrote (its marker), never the user's files.
    with pytest.raises(RecipeError, match="entries recipeforge did not write"):
        check_output(run, run / "export-x", overwrite=True)
    mark_owned(run / "export-x", "export")
    check_output(run, run / "export-x", overwrite=True)
    for guarded in (run / "final", run / "final" / "sub"):
        with pytest.raises(RecipeError, match="would replace"):
            check_output(run, guarded, overwrite=True)
    for guarded, why in ((run, "is the run directory being exported"), (tmp_path, "a parent of the run directory")):
        with pytest.raises(RecipeError, match=why):
            check_output(run, guarded, overwrite=True)


def test_int4_groups_divide_every_width():
    assert int4_group({"hidden_size": 4096, "intermediate_size": 11008, "head_dim": 128,
                       "num_attention_heads": 32}) == 128
    assert int4_group({"hidden_size": 64, "intermediate_size": 128, "head_dim": 16, "num_attention_heads": 4}) == 64
    assert int4_group({"hidden_size": 96, "intermediate_size": 160}) == 32


class _Template:
    chat_template = "x"

    @staticmethod
    def apply_chat_template(messages, tokenize):
        return " | ".join(m["content"] for m in messages)


def test_held_texts_come_from_the_runs_eval_file_else_fixed_prompts(tmp_path):
    assert held_texts(tmp_path, _Template()) == (list(FIXED_TEXTS), "4 fixed prompts")
    rows = tmp_path / "eval.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                    '{"instruction": "add", "input": "1 2", "output": "3"}\n{"text": "plain"}\n')
    (tmp_path / "resolved_recipe.yaml").write_text(f"data:\n  eval_datasets:\n    - path: {rows}\n")
    assert held_texts(tmp_path, _Template()) == (["hi | yo", "add 1 2 3", "plain"], "3 rows of eval.jsonl")


def test_the_verdict_is_the_perplexity_bound():
    ref = Measure(perplexity=10.0, greedy=[[1, 2, 3, 4]])
    near = compare(ref, Measure(10.1, [[1, 2, 3, 5]]), bound=0.02, texts_from="t")
    assert near.passed and near.greedy_match == 0.75 and near.perplexity_change == pytest.approx(0.01)
    assert not compare(ref, Measure(10.5, [[1, 2, 3, 4]]), bound=0.02, texts_from="t").passed
    assert not compare(ref, Measure(float("nan"), [[1]]), bound=0.02, texts_from="t").passed
    assert "passed" in near.line() and "+1.000%" in near.line()
