"""Vision-language rows: both input layouts to TRL's vision form, image paths, and the refusals
(that the module imports no PIL: tests/commands/test_vision_data.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from recipeforge.components.vision_data import count_images, image_base_dir, load_image, vision_rows
from recipeforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "data"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A dataset folder with img/red.png and img/blue.png; the working directory is elsewhere."""
    folder = tmp_path / "ds"
    (folder / "img").mkdir(parents=True)
    Image.new("RGB", (8, 8), (255, 0, 0)).save(folder / "img" / "red.png")
    Image.new("RGB", (8, 8), (0, 0, 255)).save(folder / "img" / "blue.png")
    return folder


def _convert(folder: Path, rows: list[dict], kind: str = "messages", **kw) -> list[dict]:
    source = folder / "train.jsonl"
    return vision_rows(rows, source=source, base_dir=image_base_dir(source), kind=kind, **kw)


def _error(folder: Path, rows: list[dict], kind: str = "messages") -> str:
    with pytest.raises(RecipeError) as info:
        _convert(folder, rows, kind)
    return str(info.value)


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


IMAGE = {"type": "image"}


def test_content_lists_become_typed_entries_and_an_ordered_image_list(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative image paths start at the dataset's folder, not here
    rows = [{"messages": [
        {"role": "system", "content": "Answer with a colour."},
        {"role": "user", "content": [{"type": "image", "image": "img/blue.png"}, _text("and"),
                                     {"type": "image_url", "image_url": {"url": "img/red.png"}}, _text("?")]},
        {"role": "assistant", "content": [_text("blue, red")]},
        {"role": "user", "content": [{"type": "image", "path": "img/red.png"}]},
        {"role": "assistant", "content": "red"}]}]
    (out,) = _convert(data_dir, rows)
    assert out == {
        "messages": [
            {"role": "system", "content": [_text("Answer with a colour.")]},
            {"role": "user", "content": [IMAGE, _text("and"), IMAGE, _text("?")]},
            {"role": "assistant", "content": [_text("blue, red")]},
            {"role": "user", "content": [IMAGE]},
            {"role": "assistant", "content": [_text("red")]}],
        "images": [str(data_dir / "img" / "blue.png"), str(data_dir / "img" / "red.png"),
                   str(data_dir / "img" / "red.png")]}
    assert count_images(out) == 3


def test_llava_placeholders_split_the_text_where_they_stand(data_dir):
    rows = [{"image": "img/red.png",
             "conversations": [{"from": "system", "value": "Be brief."},
                               {"from": "human", "value": "<image>\nWhat colour is this?"},
                               {"from": "gpt", "value": "red"}]},
            {"images": ["img/blue.png", "img/red.png"],
             "messages": [{"role": "user", "content": "Left: <image> right: <image>\nSame colour?"},
                          {"role": "assistant", "content": "no"}]}]
    first, second = _convert(data_dir, rows)
    assert first == {"messages": [{"role": "system", "content": [_text("Be brief.")]},
                                  {"role": "user", "content": [IMAGE, _text("What colour is this?")]},
                                  {"role": "assistant", "content": [_text("red")]}],
                     "images": [str(data_dir / "img" / "red.png")]}
    assert second["messages"][0]["content"] == [_text("Left: "), IMAGE, _text(" right: "), IMAGE,
                                                _text("Same colour?")]
    assert second["images"] == [str(data_dir / "img" / "blue.png"), str(data_dir / "img" / "red.png")]


def test_column_images_without_placeholders_open_the_first_user_turn(data_dir):
    rows = [{"images": ["img/red.png", "img/blue.png"],
             "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Colours?"},
                               {"from": "gpt", "value": "red, blue"}]}]
    (out,) = _convert(data_dir, rows)
    assert out["messages"][1] == {"role": "user", "content": [IMAGE, IMAGE, _text("Colours?")]}
    assert out["images"] == [str(data_dir / "img" / "red.png"), str(data_dir / "img" / "blue.png")]


def test_sharegpt_roles_map_and_the_train_switch_is_kept(data_dir):
    rows = [{"image": "img/red.png",
             "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "red",
                                                                       "train": False}]}]
    (out,) = _convert(data_dir, rows)
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"]
    assert out["messages"][1]["train"] is False


def test_named_image_column_bare_entries_urls_and_file_urls(data_dir):
    red = data_dir / "img" / "red.png"
    rows = [{"pics": ["img/red.png"],
             "messages": [{"role": "user", "content": [IMAGE, {"type": "image", "url": "https://example.com/a.png"},
                                                       {"type": "image", "image": red.as_uri()}]},
                          {"role": "assistant", "content": "ok"}]}]
    (out,) = _convert(data_dir, rows, image_column="pics")
    assert out["images"] == [str(red), "https://example.com/a.png", str(red)]
    # the default column is the first of `images`, `image` that holds a value
    (out,) = _convert(data_dir, [{"images": None, "image": "img/blue.png",
                                  "messages": [{"role": "user", "content": "<image>"},
                                               {"role": "assistant", "content": "blue"}]}])
    assert out["images"] == [str(data_dir / "img" / "blue.png")]


def test_image_root_and_the_dataset_folder(tmp_path):
    (tmp_path / "data").mkdir()
    assert image_base_dir(tmp_path / "data" / "train.jsonl") == tmp_path / "data"
    assert image_base_dir(tmp_path / "data") == tmp_path / "data"
    assert image_base_dir(tmp_path / "data" / "t.jsonl", "pics", recipe_dir=tmp_path) == tmp_path / "pics"
    assert image_base_dir("t.jsonl", str(tmp_path / "abs"), recipe_dir=Path("/elsewhere")) == tmp_path / "abs"


def test_preference_rows_hold_their_images_in_the_prompt(data_dir):
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image", "image": "img/red.png"}, _text("Colour?")]}],
             "chosen": "red", "rejected": "blue"},
            {"image": "img/blue.png", "prompt": "<image>\nColour?",
             "chosen": [{"role": "assistant", "content": "blue"}],
             "rejected": [{"role": "assistant", "content": [_text("red")]}]}]
    first, second = _convert(data_dir, rows, kind="preference")
    assert first == {"prompt": [{"role": "user", "content": [IMAGE, _text("Colour?")]}],
                     "chosen": [{"role": "assistant", "content": [_text("red")]}],
                     "rejected": [{"role": "assistant", "content": [_text("blue")]}],
                     "images": [str(data_dir / "img" / "red.png")]}
    assert second["prompt"] == [{"role": "user", "content": [IMAGE, _text("Colour?")]}]
    assert second["chosen"] == [{"role": "assistant", "content": [_text("blue")]}]
    assert second["images"] == [str(data_dir / "img" / "blue.png")]


def test_a_missing_image_names_the_file_the_row_and_the_path(data_dir):
    good = {"image": "img/red.png", "conversations": [{"from": "human", "value": "<image>"},
                                                     {"from": "gpt", "value": "red"}]}
    bad = {**good, "image": "img/green.png"}
    message = _error(data_dir, [good, good, bad])
    assert "train.jsonl: row 3: image 'img/green.png' (" + str(data_dir / "img" / "green.png") + ") not found" \
        in message


def test_the_loaders_row_number_is_used(data_dir):
    row = {"_row": 41, "image": "img/nope.png",
           "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]}
    assert "row 41:" in _error(data_dir, [row])


def test_a_corrupt_png_is_refused(data_dir):
    (data_dir / "img" / "noise.png").write_bytes(os.urandom(512))
    row = {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/noise.png"}]},
                        {"role": "assistant", "content": "?"}]}
    message = _error(data_dir, [row])
    assert "train.jsonl: row 1:" in message and str(data_dir / "img" / "noise.png") in message
    assert "cannot be read as an image" in message


def test_a_truncated_png_is_refused(data_dir, tmp_path):
    # A real PNG cut short: its header is fine, its pixels are not all there.
    Image.effect_noise((64, 64), 50).convert("RGB").save(tmp_path / "full.png")
    body = (tmp_path / "full.png").read_bytes()
    (data_dir / "img" / "cut.png").write_bytes(body[: len(body) // 2])
    row = {"image": "img/cut.png", "conversations": [{"from": "human", "value": "<image>"},
                                                     {"from": "gpt", "value": "x"}]}
    message = _error(data_dir, [row])
    assert "row 1:" in message and "cut.png" in message and "cannot be read as an image" in message


def test_placeholders_must_match_the_images(data_dir):
    rows = [{"image": "img/red.png", "conversations": [{"from": "human", "value": "x"},
                                                       {"from": "gpt", "value": "y"}]}] * 6
    rows = rows + [{"image": "img/red.png", "conversations": [{"from": "human", "value": "<image> and <image>"},
                                                              {"from": "gpt", "value": "y"}]}]
    message = _error(data_dir, rows)
    assert "train.jsonl: row 7: has 2 <image> placeholders and 1 image" in message
    # a placeholder without any image column
    message = _error(data_dir, [{"messages": [{"role": "user", "content": "<image> hi"},
                                              {"role": "assistant", "content": "y"}]}])
    assert "row 1: has 1 <image> placeholder and 0 images" in message


def test_an_image_in_an_assistant_turn_is_refused(data_dir):
    row = {"messages": [{"role": "user", "content": "Draw red."},
                        {"role": "assistant", "content": [{"type": "image", "image": "img/red.png"}]}]}
    message = _error(data_dir, [row])
    assert "train.jsonl: row 1: messages[1] (an assistant turn) holds an image" in message
    llava = {"image": "img/red.png", "conversations": [{"from": "human", "value": "Draw red."},
                                                       {"from": "gpt", "value": "<image>"}]}
    assert "conversations[1] (an assistant turn) holds an image" in _error(data_dir, [llava])
    pref = {"prompt": "Draw red.", "chosen": [{"role": "assistant", "content": [{"type": "image",
                                                                                 "image": "img/red.png"}]}],
            "rejected": "no"}
    assert "chosen[0] (an assistant turn) holds an image" in _error(data_dir, [pref], kind="preference")


def test_video_is_refused(data_dir):
    row = {"messages": [{"role": "user", "content": [{"type": "video", "video": ["img/red.png", "img/blue.png"]}]},
                        {"role": "assistant", "content": "?"}]}
    assert "row 1: messages[0] content[0] is a video; video is not supported yet" in _error(data_dir, [row])


def test_images_in_both_places_without_placeholders_are_refused(data_dir):
    row = {"images": ["img/blue.png"],
           "messages": [{"role": "user", "content": [{"type": "image", "image": "img/red.png"}, _text("?")]},
                        {"role": "assistant", "content": "?"}]}
    assert "has images both in its messages and in its image column" in _error(data_dir, [row])


def test_load_image_gives_rgb_and_refuses_urls_and_broken_files(data_dir):
    Image.new("RGBA", (4, 4), (0, 255, 0, 128)).save(data_dir / "img" / "alpha.png")
    Image.new("P", (4, 4)).save(data_dir / "img" / "palette.png")
    for name in ("red.png", "alpha.png", "palette.png"):
        img = load_image(str(data_dir / "img" / name))
        assert img.mode == "RGB" and img.size in {(8, 8), (4, 4)}
    assert load_image(str(data_dir / "img" / "red.png")).getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(RecipeError, match="network images must be downloaded first"):
        load_image("https://example.com/a.png")
    (data_dir / "img" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(RecipeError, match="bad.png cannot be read"):
        load_image(str(data_dir / "img" / "bad.png"))


def test_the_example_datasets_convert_and_each_answer_names_its_images_colour():
    for name, kind in (("vlm-sft.jsonl", "messages"), ("vlm-sft-llava.jsonl", "messages"),
                       ("vlm-dpo.jsonl", "preference")):
        path = EXAMPLES / name
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out = vision_rows(rows, source=path, base_dir=image_base_dir(path), kind=kind)
        assert len(out) == len(rows) >= 12
        for row in out:
            (image,) = row["images"]
            colour = Path(image).stem
            assert Path(image).is_file() and Image.open(image).getpixel((0, 0)) != (0, 0, 0)
            answer = row["chosen"][-1] if kind == "preference" else row["messages"][-1]
            assert answer == {"role": "assistant", "content": [_text(colour)]}
            if kind == "preference":
                assert row["rejected"][0]["content"] != answer["content"]


def test_images_column_schema_needs_a_chat_format():
    from pydantic import ValidationError

    from recipeforge.config.schema.data import DatasetSpec

    spec = DatasetSpec(path="d.jsonl", format="messages", images="pics", image_root="imgs")
    assert (spec.images, spec.image_root) == ("pics", "imgs")
    with pytest.raises(ValidationError, match="`images` needs format: messages or preference"):
        DatasetSpec(path="d.jsonl", format="alpaca", images="pics")


def test_rows_read_from_parquet_convert_like_the_json_lines(tmp_path):
    # Parquet (struct columns) gives every content entry every key and every row every column, None where
    # unused; the LLaVA-style row below adds an `image` column the others have as None.
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (EXAMPLES / "vlm-sft.jsonl").read_text().splitlines()]
    rows.insert(0, {"image": "images/red.png", "messages": [{"role": "user", "content": [_text("<image>Colour?")]},
                                                             {"role": "assistant", "content": [_text("red")]}]})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    read = datasets.Dataset.from_parquet(str(tmp_path / "mixed.parquet"), cache_dir=str(tmp_path / "cache")).to_list()
    assert read[1]["image"] is None and read[1]["messages"][0]["content"][0]["text"] is None
    base = image_base_dir(EXAMPLES / "vlm-sft.jsonl")
    converted = vision_rows(read, source="mixed.parquet", base_dir=base)
    assert converted == vision_rows(rows, source="mixed.jsonl", base_dir=base)
    assert converted[0]["messages"][0]["content"] == [IMAGE, _text("Colour?")]


def test_validate_refuses_an_image_column_on_a_text_format(tmp_path, capsys):
    from recipeforge.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"stage: sft\nmodel: {{name_or_path: 'tiny:llama'}}\ndata:\n  datasets:\n"
                      f"    - {{path: {EXAMPLES / 'sft-alpaca.jsonl'}, format: alpaca, images: pics}}\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:5" in err and "`images` needs format: messages or preference (got format: alpaca)" in err
    recipe.write_text(recipe.read_text().replace("alpaca.jsonl", "chat.jsonl").replace("alpaca,", "messages,"))
    assert main(["validate", str(recipe)]) == 0


def test_a_truncated_jpeg_is_refused(data_dir, tmp_path):
    Image.effect_noise((64, 64), 50).convert("RGB").save(tmp_path / "full.jpg", quality=95)
    body = (tmp_path / "full.jpg").read_bytes()
    (data_dir / "img" / "cut.jpg").write_bytes(body[: len(body) // 2])
    row = {"images": ["img/red.png", "img/cut.jpg"],
           "conversations": [{"from": "human", "value": "<image><image>"}, {"from": "gpt", "value": "x"}]}
    message = _error(data_dir, [row])
    assert "row 1: image 'img/cut.jpg'" in message and "cannot be read as an image" in message


def test_images_held_in_the_data_are_kept_as_files_named_by_content(tmp_path):
    # hub datasets store images in an Image column: {"bytes", "path"} undecoded, or PIL images decoded
    import io

    from PIL import Image

    from recipeforge.components.vision_data import vision_rows

    red = Image.new("RGB", (8, 8), (255, 0, 0))
    buffer = io.BytesIO()
    red.save(buffer, format="PNG")
    rows = [{"images": [{"bytes": buffer.getvalue(), "path": None}],
             "messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}]},
            {"images": [red],
             "messages": [{"role": "user", "content": "<image>And this?"}, {"role": "assistant", "content": "red"}]}]
    out = vision_rows(rows, source="hub/colours", base_dir=tmp_path, embedded_dir=tmp_path / "images")
    first, second = out[0]["images"][0], out[1]["images"][0]
    assert first == second and first.startswith(str(tmp_path / "images")) and first.endswith(".png")
    with Image.open(first) as img:
        assert img.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    assert out[0]["messages"][0]["content"][0] == {"type": "image"}
    assert [p.name for p in (tmp_path / "images").iterdir()] == [Path(first).name]  # written once


def test_bad_bytes_held_in_the_data_are_a_located_error(tmp_path):
    from recipeforge.components.vision_data import vision_rows
    from recipeforge.errors import RecipeError

    rows = [{"images": [{"bytes": b"not an image", "path": None}],
             "messages": [{"role": "user", "content": "<image>?"}, {"role": "assistant", "content": "x"}]}]
    with pytest.raises(RecipeError, match=r"hub/colours: row 1: image 1 of column 'images' holds bytes that are not"):
        vision_rows(rows, source="hub/colours", base_dir=tmp_path, embedded_dir=tmp_path / "images")
    with pytest.raises(RecipeError, match="no image folder"):
        vision_rows(rows, source="hub/colours", base_dir=tmp_path)
