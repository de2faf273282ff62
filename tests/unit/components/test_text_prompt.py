"""Text prompts (`data.datasets[].prompt`) and the `segments` format: what a row becomes, and the errors a
recipe author sees."""

from __future__ import annotations

import pytest

from recipeforge.components.formats import RenderOptions, get_format
from recipeforge.components.text_prompt import chat_template, columns, render
from recipeforge.config import load_recipe
from recipeforge.config.schema.data import TextPrompt
from recipeforge.errors import RecipeError



@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str):
        path = tmp_path / name
        path.write_text(text)
        return path
    return _write


ALPACA = TextPrompt(turn="I: {instruction}\nX: {input}\nR: ", turn_no_input="I: {instruction}\nR: ",
                    system="with input", system_no_input="no input", system_format="<{system}>\n")


def test_the_input_chooses_the_turn_and_the_system_text():
    assert render(ALPACA, {"instruction": "a", "input": "b", "output": "c"}) == ("<with input>\nI: a\nX: b\nR: ", "c")
    assert render(ALPACA, {"instruction": "a", "input": "", "output": "c"}) == ("<no input>\nI: a\nR: ", "c")
    assert render(ALPACA, {"instruction": "a", "output": "c"}) == ("<no input>\nI: a\nR: ", "c")  # no input column
    # the row's system text only with row_system, and only when it is not empty
    row = {"instruction": "a", "system": "mine", "output": "c"}
    assert render(ALPACA, row)[0].startswith("<no input>")
    own = ALPACA.model_copy(update={"row_system": True})
    assert render(own, row)[0] == "<mine>\nI: a\nR: " and render(own, {**row, "system": ""})[0].startswith("<no input>")
    # an empty system text writes no system part at all
    none = ALPACA.model_copy(update={"system_no_input": ""})
    assert render(none, {"instruction": "a", "output": "c"})[0] == "I: a\nR: "


def test_placeholders_name_columns_and_say_which_are_needed():
    qa = TextPrompt(turn="{article}\n===\n{question}", turn_no_input="{article}\n===\n{question}",
                    output_format="Answer: {answer}")
    assert columns(qa) == (("article", "question", "answer"), ("input",))
    assert render(qa, {"article": "A", "question": "Q?", "answer": "yes"}) == ("A\n===\nQ?", "Answer: yes")
    assert columns(ALPACA.model_copy(update={"row_system": True}))[1] == ("input", "system")


def test_a_recipe_with_a_bad_prompt_is_refused_with_the_key(write):
    base = ("stage: sft\nmodel: {name_or_path: tiny:llama}\ndata:\n  datasets:\n    - path: d.jsonl\n"
            "      format: %s\n      prompt: {turn: %s, turn_no_input: 'I: {instruction}'}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", base % ("alpaca", "'I: {instruction!r}'")))
    assert "turn" in str(exc.value) and "format spec or conversion" in str(exc.value)
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", base % ("alpaca", "'I: {0}'")))
    assert "is not a column name" in str(exc.value)
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", base % ("messages", "'I: {instruction}'")))
    assert "`prompt` needs format: alpaca" in str(exc.value)
    assert load_recipe(write("r.yaml", base % ("alpaca", "'I: {instruction} {{literal}}'"))).recipe.data.datasets[0].prompt


def test_the_chat_template_writes_the_prompt_and_only_for_instruction_prompts():
    from recipeforge.components.tokenizer import load_tokenizer

    tok = load_tokenizer("tiny:llama")
    tok.chat_template = chat_template(ALPACA, bos=True)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == tok.bos_token + render(ALPACA, {"instruction": "hi", "output": ""})[0]
    with_system = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                          tokenize=False, add_generation_prompt=True)
    assert with_system == tok.bos_token + "<S>\nI: hi\nR: "
    assert chat_template(TextPrompt(turn="{q}", turn_no_input="{q}", output_format="{a}"), bos=False) is None


def test_segments_are_tokenized_apart_with_nothing_added_and_bad_rows_named():
    from recipeforge.components.tokenizer import load_tokenizer

    fmt = get_format("segments")
    opts = RenderOptions(load_tokenizer("tiny:llama"), eos_token="<|im_end|>", prefix_ids=(1,))
    row = {"segments": [{"text": "Q: hi\n", "label": False}, {"text": "A: yo", "label": True}]}
    assert fmt.render(row, opts) == [("Q: hi\n", False), ("A: yo", True)]
    assert fmt.render(row, RenderOptions(opts.tokenizer, train_on_inputs=True))[0] == ("Q: hi\n", True)
    with pytest.raises(RecipeError, match="segment 1: `label` must be true"):
        fmt.render({"segments": [{"text": "x", "label": "yes"}]}, opts)
    with pytest.raises(RecipeError, match="non-empty list"):
        fmt.render({"segments": "text"}, opts)


def test_a_completion_that_ends_in_eos_gets_no_second_one():
    fmt = get_format("completion")
    opts = RenderOptions(None, eos_token="</s>")
    assert fmt.render({"prompt": "p", "completion": "c</s>"}, opts) == [("p", False), ("c</s>", True)]
    assert fmt.render({"prompt": "p", "completion": "c"}, opts)[-1] == ("</s>", True)


def test_a_streamed_dataset_is_written_with_its_prompt(write, tmp_path):
    from recipeforge.components.lm_stream import open_stream

    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "input": "b", "output": "c"}\n')
    text = ("stage: sft\nmodel: {name_or_path: tiny:llama}\ntrain: {max_steps: 1}\ndata:\n  streaming: true\n"
            "  datasets:\n    - path: d.jsonl\n      format: alpaca\n"
            "      prompt: {turn: 'I: {instruction} X: {input} R: ', turn_no_input: 'I: {instruction} R: '}\n")
    recipe = load_recipe(write("r.yaml", text)).recipe
    row = next(iter(open_stream(recipe.data, base_dir=tmp_path, locate=lambda p: None, seed=1, rank=0, world=1)))
    assert (row["prompt"], row["completion"]) == ("I: a X: b R: ", "c")
