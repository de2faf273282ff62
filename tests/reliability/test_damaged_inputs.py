"""Every file the surfaces read fails as a located exit 2 (or a clean skip with a warning), never as an
internal error: a truncated final/model.safetensors in `serve` (the first report), and beyond it the same
file in `chat`, `eval` and `export`, a damaged adapter in `merge`, a config.json that is not JSON, an
adapter config and a resolved recipe that are not what they should be (`push`), a damaged checkpoint in
`eval --checkpoints` (skipped, with the reason), a stream shard that breaks after the pre-check, image
URLs that answer 404 or an HTML page, and bytes on chat's stdin that are not text or a message past the
model's context."""

from __future__ import annotations

import json
import os
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from recipeforge.components.vision_data import vision_rows
from recipeforge.errors import RecipeError
from surface_testing import REPO, recipeforge, refused

pytestmark = pytest.mark.slow

IMAGES = REPO / "examples" / "data" / "images"
QA = '{"prompt": "The cow says", "reference": "moo"}\n{"prompt": "The dog says", "reference": "woof"}\n'


def _truncate(path: Path, keep: float = 0.5) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(int(path.stat().st_size * keep))


def test_a_damaged_final_model_is_named_by_every_command(full_run, lora_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    _truncate(run / "final" / "model.safetensors")
    (tmp_path / "qa.jsonl").write_text(QA)
    for args in (["serve", str(run), "--port", "0", "--engine", "transformers"],
                 ["chat", str(run)],
                 ["eval", str(run), "--tasks", "qa.jsonl"],
                 ["export", str(run), "--format", "safetensors", "-o", str(tmp_path / "out")]):
        refused(recipeforge(*args, cwd=tmp_path, stdin=b"hello\n/exit\n"), "model.safetensors", "(truncated)",
                str(run / "final"))
    assert not (tmp_path / "out").exists()
    # config.json that is not JSON: export reads it before any library does.
    (run / "final" / "config.json").write_text("{not json")
    refused(recipeforge("export", str(run), "--format", "safetensors", cwd=tmp_path), "config.json",
            "not a readable JSON")
    # A LoRA run: a truncated adapter for merge, a damaged adapter config and resolved recipe for push.
    lora = tmp_path / "lora"
    shutil.copytree(lora_run, lora)
    _truncate(lora / "final" / "adapter_model.safetensors")
    refused(recipeforge("merge", str(lora), cwd=tmp_path), "adapter_model.safetensors", "(truncated)")
    assert not (lora / "merged").exists()
    (lora / "resolved_recipe.yaml").write_bytes(b"\xff\xfe: [\n")
    (lora / "final" / "adapter_config.json").write_text("[1, 2]")
    refused(recipeforge("push", str(lora), "--dry-run", cwd=tmp_path), "adapter_config.json", "not a JSON object")


def test_a_damaged_checkpoint_is_skipped_with_the_reason(full_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    damaged, kept = sorted((run / "checkpoints").iterdir())
    _truncate(damaged / "model.safetensors")
    (tmp_path / "qa.jsonl").write_text(QA)
    done = recipeforge("eval", str(run), "--tasks", "qa.jsonl", "--checkpoints", "--limit", "2", cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    assert f"warning: skipping {damaged}: it is damaged (model.safetensors:" in err
    assert (run / "eval" / "qa.json").is_file() and (run / "eval" / kept.name / "qa.json").is_file()
    assert not (run / "eval" / damaged.name).exists()


def test_a_stream_shard_that_breaks_mid_run_is_named(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, count in enumerate((1000, 200)):
        rows = [json.dumps({"text": f"shard {i} row {j}: the cow says moo"}) for j in range(count)]
        if i == 1:
            rows[60] = '{"text": "a row cut in the middle'  # just past the 1,024 rows of the check before the run
        (shards / f"part-{i}.jsonl").write_text("\n".join(rows) + "\n")
    recipe = tmp_path / "s.yaml"
    recipe.write_text("stage: pretrain\nmodel: {name_or_path: tiny:llama}\nhardware: {gpus_per_node: 0}\n"
                      "data:\n  datasets: [{path: shards/part-*.jsonl, format: text}]\n  packing: true\n"
                      "  streaming: true\n  stream_window: 512\n  sequence_len: 64\n"
                      "train: {max_steps: 400, global_batch_size: 16, micro_batch_size: 16}\n"
                      "logging: {progress_bar: false}\noutput: {save_steps: 1000}\n")
    err = refused(recipeforge("train", str(recipe), f"output.dir={tmp_path / 'run'}", cwd=tmp_path),
                  "data.datasets", str(shards / "part-1.jsonl"), "run the same command again")
    assert "s.yaml:5" in err  # located at the dataset entry of the recipe


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def image_server(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(IMAGES / "red.png", site / "red.png")
    (site / "page.png").write_text("<html><body>Sign in to see this image</body></html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _rows(url: str) -> list[dict]:
    return [{"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                       {"type": "text", "text": "Colour?"}]},
                          {"role": "assistant", "content": "red"}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                       {"type": "text", "text": "Colour?"}]},
                          {"role": "assistant", "content": "red"}]}]


def test_image_urls_are_fetched_before_training_and_named_when_they_fail(image_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(IMAGES / "red.png", data / "red.png")
    cache = tmp_path / "images"
    rows = vision_rows(_rows(f"{image_server}/red.png"), source=data / "v.jsonl", base_dir=data,
                       embedded_dir=cache)
    fetched = Path(rows[1]["images"][0])
    assert fetched.parent == cache and fetched.read_bytes() == (IMAGES / "red.png").read_bytes()
    for path, words in (("/missing.png", "HTTP 404"), ("/page.png", "is not an image")):
        with pytest.raises(RecipeError) as info:
            vision_rows(_rows(f"{image_server}{path}"), source="v.jsonl", base_dir=data, embedded_dir=cache)
        assert "v.jsonl: row 2:" in str(info.value) and words in str(info.value)
    # As a user meets it: `train` stops at the row, before any training step.
    (data / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(f"{image_server}/missing.png") * 2))
    recipe = tmp_path / "vlm.yaml"
    recipe.write_text(f"extends: {REPO / 'examples' / 'yaml' / 'tiny' / 'vlm-sft-lora.yaml'}\n"
                      f"data:\n  datasets: [{{path: {data / 'v.jsonl'}, format: messages}}]\n"
                      f"  cache_dir: {tmp_path / 'cache'}\n"
                      "train: {max_steps: 1, global_batch_size: 2, micro_batch_size: 2}\n")
    err = refused(recipeforge("train", str(recipe), f"output.dir={tmp_path / 'run'}", cwd=tmp_path),
                  "row 2:", "missing.png", "HTTP 404")
    assert "'loss'" not in err


def test_chat_survives_bytes_that_are_not_text_and_messages_past_the_context(full_run, tmp_path):
    context = json.loads((full_run / "final" / "config.json").read_text())["max_position_embeddings"]
    stdin = b"\xff\xfe caf\xe9\n" + b"moo " * (2 * context) + b"\nhello\n/exit\n"
    done = recipeforge("chat", str(full_run), "--max-new-tokens", "3", "--temperature", "0", cwd=tmp_path,
                       stdin=stdin)
    out = done.stdout.decode()
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr.decode()[-3000:]
    assert f"past the model's context of {context}" in out and out.count(">>> ") == 4, out
