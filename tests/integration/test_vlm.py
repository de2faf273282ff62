"""Vision-language models end to end on the tiny LLaVA (CLIP tower, MLP projector, tiny Llama), on CPU:
SFT with LoRA and in full learns the colour of a square, the frozen tower stays bit-identical, the
processor is saved and final/ and merged/ answer for an image, image tokens carry no loss, DPO with
images raises the reward accuracy, and packing, GRPO and a mismatched image size are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "yaml" / "tiny"
IMAGES = REPO / "examples" / "data" / "images"
COLOURS = ("red", "green", "blue", "yellow", "orange", "purple")
TOWER = "vision_tower."
PROJECTOR = "multi_modal_projector."


def _train(recipe: Path | str, run: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run}",
                           f"data.cache_dir={cache}", "logging.progress_bar=false", *overrides],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _train_here(recipe: Path | str, run: Path, cache: Path, *overrides: str, nproc: int = 1) -> Path:
    """The run trained in this process (launched from it for `nproc` > 1), for the tests of what a run
    learns and writes; the refusals, whose subject is the command's exit and message, run `_train`."""
    from recipeforge.config import load_recipe
    from recipeforge.run import LaunchOptions, train

    loaded = load_recipe(recipe, overrides=[f"output.dir={run}", f"data.cache_dir={cache}",
                                            "logging.progress_bar=false", *overrides])
    done = train(loaded, launch=LaunchOptions(nproc_per_node=nproc) if nproc > 1 else None)
    assert done is not None
    return done


def _losses(run: Path, key: str = "loss") -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r[key] for r in rows if r.get(key) is not None and r.get("split", "train") == "train"]


def _answers(path: Path) -> dict[str, str]:
    """Greedy answers of the model saved at `path` (AutoModelForImageTextToText + AutoProcessor) to
    "What colour is this square?" for each coloured square."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(path)).eval()
    processor = AutoProcessor.from_pretrained(str(path))
    out = {}
    for colour in COLOURS:
        image = Image.open(IMAGES / f"{colour}.png").convert("RGB")
        messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": "What colour is this square?"}]}]
        inputs = processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                               add_generation_prompt=True)
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=3, do_sample=False)
        out[colour] = processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _start_weights() -> dict:
    """The weights a tiny:llava run starts from (same seed as the recipes: base.yaml's 42)."""
    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    tok = load_tokenizer("tiny:llava")
    model = load_model("tiny:llava", tok, device="cpu", dtype="fp32", seed=42)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _by_suffix(weights: dict, part: str) -> dict:
    """{name from `part` on: tensor} for the tensors of one part (names differ in their prefix)."""
    return {k[k.index(part):]: v for k, v in weights.items() if part in k}


@pytest.mark.slow
def test_lora_sft_learns_colours_and_saves_processor(tmp_path):
    run = tmp_path / "run"
    _train_here(TINY / "vlm-sft-lora.yaml", run, tmp_path / "cache")
    losses = _losses(run)
    assert losses[-1] < 0.1 * losses[0], losses  # 6.9 -> ~0.13
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    targets = adapter["target_modules"]
    assert not any("vision_tower" in t for t in targets), targets
    assert any("multi_modal_projector" in t for t in targets)  # train_projector: true in the recipe
    assert any("language_model" in t and t.endswith("q_proj") for t in targets)
    for folder in ("final", "merged"):
        assert {"processor_config.json", "chat_template.jinja", "tokenizer.json"} <= \
            {p.name for p in (run / folder).iterdir()}, folder
    answers = _answers(run / "merged")
    right = [c for c, a in answers.items() if a.strip() == c]
    assert len(right) >= 5, answers  # all six on this machine
    # final/ (the adapter) loads the same way, onto base_model/.
    assert _answers(run / "final") == answers
    # The frozen tower of the base is the one the run started from.
    start, base = _by_suffix(_start_weights(), TOWER), _by_suffix(_tensors(run / "base_model"), TOWER)
    assert start.keys() == base.keys() and all(base[k].equal(start[k]) for k in start)


@pytest.mark.slow
def test_full_sft_freezes_the_tower_unless_asked(tmp_path):
    start = _start_weights()
    frozen, trained = tmp_path / "frozen", tmp_path / "tower"
    common = ("adapter.type=none", "~adapter.modules_to_save", "output.merge_adapter=false", "train.max_steps=40",
              "train.learning_rate=1e-2")
    _train_here(TINY / "vlm-sft-lora.yaml", frozen, tmp_path / "cache", *common)
    losses = _losses(frozen)
    assert losses[-1] < 0.1 * losses[0], losses  # 6.9 -> ~0.3
    final = _tensors(frozen / "final")
    for part, same in ((TOWER, True), (PROJECTOR, False)):  # the recipe trains the projector
        got, want = _by_suffix(final, part), _by_suffix(start, part)
        assert got.keys() == want.keys() and got
        assert all(got[k].equal(want[k]) for k in want) is same, part
    def language_q(weights: dict):  # saved names and in-memory names differ in their prefix
        return next(v for k, v in weights.items() if TOWER not in k and k.endswith("layers.0.self_attn.q_proj.weight"))

    assert not language_q(final).equal(language_q(start))
    answers = _answers(frozen / "final")  # final/ of a full run loads with the auto classes and answers
    assert sum(a.strip() == c for c, a in answers.items()) >= 5, answers

    _train_here(TINY / "vlm-sft-lora.yaml", trained, tmp_path / "cache", *common, "model.vision.train_tower=true",
                "train.max_steps=4")
    got, want = _by_suffix(_tensors(trained / "final"), TOWER), _by_suffix(start, TOWER)
    assert any(not got[k].equal(want[k]) for k in want)


@pytest.mark.slow
def test_dpo_with_images_raises_reward_accuracy(tmp_path):
    run = tmp_path / "run"
    _train_here(TINY / "vlm-dpo.yaml", run, tmp_path / "cache")
    acc, margins = _losses(run, "rewards/accuracies"), _losses(run, "rewards/margins")
    assert acc[0] <= 0.5 and max(acc[-3:]) >= 0.9, acc
    assert margins[-1] > margins[0] + 0.5, margins
    assert (run / "final" / "processor_config.json").is_file()


def test_llava_rows_with_an_image_root_train(tmp_path):
    # ShareGPT rows with an `image` column and <image> placeholders, the images under a folder of their own
    rows = (REPO / "examples" / "data" / "vlm-sft-llava.jsonl").read_text()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text(rows)
    run = tmp_path / "run"
    _train_here(TINY / "vlm-sft-lora.yaml", run, tmp_path / "cache", f"data.datasets[0].path={tmp_path}/data/rows.jsonl",
                f"data.datasets[0].image_root={REPO}/examples/data", "data.datasets[0].images=image",
                "train.max_steps=30", "output.save_steps=30", "output.merge_adapter=false")
    loss = _losses(run)
    assert loss[-1] < loss[0] - 2.0, loss
    # without the root, the relative paths are looked for next to the dataset, and the error says where
    missing = _train(TINY / "vlm-sft-lora.yaml", tmp_path / "run2", tmp_path / "cache",
                     f"data.datasets[0].path={tmp_path}/data/rows.jsonl")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "rows.jsonl" in missing.stderr and "row 1" in missing.stderr and "images/red.png" in missing.stderr


def test_images_held_in_a_parquet_image_column_train(tmp_path):
    # as hub datasets store them: a `datasets` Image column, the image bytes inside the file
    import datasets
    from PIL import Image

    rows = [json.loads(line) for line in (REPO / "examples" / "data" / "vlm-sft-llava.jsonl").read_text().splitlines()]
    table = [{"images": [Image.open(IMAGES / Path(r["image"]).name).convert("RGB")],
              "messages": [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
                           for t in r["conversations"]]} for r in rows]
    datasets.Dataset.from_list(table).to_parquet(str(tmp_path / "colours.parquet"))
    run = tmp_path / "run"
    _train_here(TINY / "vlm-sft-lora.yaml", run, tmp_path / "cache", f"data.datasets[0].path={tmp_path}/colours.parquet",
                "train.max_steps=30", "output.save_steps=30", "output.merge_adapter=false")
    loss = _losses(run)
    assert loss[-1] < loss[0] - 2.0, loss
    assert len(list((tmp_path / "cache" / "images").iterdir())) == len(COLOURS)  # one file per distinct image


@pytest.mark.skipif(__import__("importlib").util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_on_a_vision_model_learns(tmp_path):
    run = tmp_path / "run"
    _train_here(TINY / "vlm-sft-lora.yaml", run, tmp_path / "cache", "adapter.type=qlora", "train.max_steps=40",
                "output.save_steps=40", "output.merge_adapter=false")
    loss = _losses(run)
    assert loss[-1] < loss[0] - 3.0, loss
    targets = json.loads((run / "final" / "adapter_config.json").read_text())["target_modules"]
    assert targets and not any(TOWER in t for t in targets)


def test_fsdp_on_two_processes_shards_the_tower_layer_by_layer(tmp_path):
    run = tmp_path / "run"
    _train_here(TINY / "vlm-sft-lora.yaml", run, tmp_path / "cache", "train.max_steps=30", "output.save_steps=30",
                "train.micro_batch_size=auto", "distributed.backend=fsdp", "output.merge_adapter=false", nproc=2)
    assert "fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer,CLIPEncoderLayer" in \
        (run / "accelerate_config.yaml").read_text()
    seen = json.loads((run / "backend.json").read_text())["observed"]
    assert seen["num_processes"] == 2 and seen["dtensor_params"] == seen["params"]
    # each process holds half of every weight (uneven dimensions: up to a row more)
    assert seen["full_param_elements"] / 2 <= seen["local_param_elements"] < seen["full_param_elements"] * 0.51
    loss = _losses(run)
    assert loss[-1] < loss[0] - 3.0, loss


BAD_ROWS = {
    "corrupt image": ({"messages": [{"role": "user", "content": [{"type": "image", "image": "broken.png"},
                                                                 {"type": "text", "text": "What colour?"}]},
                                    {"role": "assistant", "content": "red"}]}, ["broken.png", "cannot be read"]),
    "missing image": ({"messages": [{"role": "user", "content": [{"type": "image", "image": "nowhere.png"},
                                                                 {"type": "text", "text": "What colour?"}]},
                                    {"role": "assistant", "content": "red"}]}, ["nowhere.png", "not found"]),
    "placeholder count": ({"images": [str(IMAGES / "red.png")],
                           "messages": [{"role": "user", "content": "<image><image> What colours?"},
                                        {"role": "assistant", "content": "red"}]},
                          ["2 <image> placeholders", "1 image"]),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_image_rows_are_located_errors(tmp_path, case):
    row, words = BAD_ROWS[case]
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    good = json.loads((REPO / "examples" / "data" / "vlm-sft.jsonl").read_text().splitlines()[0])
    good["messages"][0]["content"] = [dict(c, image=str(IMAGES / Path(c["image"]).name)) if c.get("type") == "image"
                                      else c for c in good["messages"][0]["content"]]
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    proc = _train(TINY / "vlm-sft-lora.yaml", tmp_path / "run", tmp_path / "cache", f"data.datasets[0].path={data}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for word in ["rows.jsonl", "row 2", *words]:
        assert word in proc.stderr, (word, proc.stderr[-2000:])
    assert not (tmp_path / "run" / "final").exists()


def test_packing_with_images_refused(tmp_path):
    proc = _train(TINY / "vlm-sft-lora.yaml", tmp_path / "run", tmp_path / "cache", "data.packing=true")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "data.packing" in proc.stderr and "Traceback" not in proc.stderr
    assert "position ids" in proc.stderr
    assert not (tmp_path / "run").exists()  # refused by the plan, before anything is written


def test_grpo_with_a_vision_model_refused(tmp_path):
    proc = _train(TINY / "grpo.yaml", tmp_path / "run", tmp_path / "cache", "model.name_or_path=tiny:llava")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "stage grpo cannot train the vision-language model" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def _processor_and_rows():
    from recipeforge.components.vision_data import vision_rows
    from recipeforge.components.vision_model import load_processor
    from recipeforge.components.tokenizer import load_tokenizer
    from recipeforge.config import load_recipe

    recipe = load_recipe(TINY / "vlm-sft-lora.yaml").recipe
    tok = load_tokenizer("tiny:llava")
    processor = load_processor(recipe, tok)
    data = REPO / "examples" / "data" / "vlm-sft.jsonl"
    raw = [json.loads(line) for line in data.read_text().splitlines()[:4]]
    return processor, vision_rows(raw, source=data, base_dir=data.parent)


def test_image_tokens_carry_no_loss():
    """TRL's vision collator, as the SFT stage sets it up: labels are -100 at every image token and
    everywhere outside the assistant reply, which is trained with its turn end."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    processor, rows = _processor_and_rows()
    batch = DataCollatorForVisionLanguageModeling(processor=processor, assistant_only_loss=True)(rows)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    ids, labels = batch["input_ids"], batch["labels"]
    at_images = ids == image_id
    assert int(at_images.sum()) == 16 * len(rows)  # 28x28 crop in 7x7 patches: 16 tokens per image
    assert (labels[at_images] == -100).all()
    for i, row in enumerate(rows):
        trained = processor.tokenizer.decode(labels[i][labels[i] != -100])
        assert trained == row["messages"][-1]["content"][0]["text"] + "<|im_end|>", trained


def test_image_token_mismatch_refused():
    """A processor that writes a different number of image tokens than the model makes features is
    refused before training, naming the row."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from recipeforge.components.models import tiny_config
    from recipeforge.components.vision_model import check_image_tokens
    from recipeforge.errors import RecipeError

    processor, rows = _processor_and_rows()
    config = tiny_config("llava", processor.tokenizer)
    collate = DataCollatorForVisionLanguageModeling(processor=processor, assistant_only_loss=True)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    check_image_tokens(collate, [("row 1", rows[0])], config, image_id, 128)  # agrees: no error
    config.vision_config.image_size = 56  # the model would make 64 features of a 56x56 image
    with pytest.raises(RecipeError, match="row 1: the processor wrote 16 image tokens .* the model expects 64"):
        check_image_tokens(collate, [("row 1", rows[0])], config, image_id, 128)
    config.vision_config.image_size = 28
    with pytest.raises(RecipeError, match="data.sequence_len is 10"):
        check_image_tokens(collate, [("row 1", rows[0])], config, image_id, 10)


def test_lora_targets_follow_the_vision_settings():
    from types import SimpleNamespace

    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer
    from recipeforge.components.vision_model import lora_targets

    tok = load_tokenizer("tiny:llava")
    model = load_model("tiny:llava", tok, device="cpu", dtype="fp32", seed=0)
    adapter = SimpleNamespace(target_modules="all-linear", modules_to_save=())

    def targets(tower: bool, projector: bool, names=None) -> list[str]:
        a = adapter if names is None else SimpleNamespace(target_modules=names, modules_to_save=())
        return lora_targets(model, a, SimpleNamespace(train_tower=tower, train_projector=projector))

    plain = targets(False, False)
    assert plain and all("language_model" in t for t in plain) and "lm_head" not in plain
    assert any("multi_modal_projector" in t for t in targets(False, True))
    assert not any("vision_tower" in t for t in targets(False, True))
    assert any("vision_tower" in t for t in targets(True, False))
    assert all(t.endswith(("q_proj", "v_proj")) for t in targets(True, True, ["q_proj", "v_proj"]))


def test_qwen_vl_tower_and_merger_are_found():
    """The table's Qwen2.5-VL entry against a real (small, random) Qwen2.5-VL: `model.visual` is the
    tower, `visual.merger` the projector; full fine-tuning freezes both, LoRA adapts neither."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig

    from recipeforge.components.vision_model import freeze_vision, lora_targets

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           spatial_merge_size=2, out_hidden_size=64, fullatt_block_indexes=[1]),
        image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    frozen = SimpleNamespace(train_tower=False, train_projector=False)
    counts = freeze_vision(model, frozen)
    assert counts["tower"] == counts["projector"] == 0 and counts["language"] > 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(".visual." in f".{n}" for n in trainable)
    assert any("visual.merger" in n for n, _ in model.named_parameters())
    adapter = SimpleNamespace(target_modules="all-linear", modules_to_save=())
    targets = lora_targets(model, adapter, frozen)
    assert targets and not any("visual" in t for t in targets)
    with_merger = lora_targets(model, adapter, SimpleNamespace(train_tower=False, train_projector=True))
    assert {t for t in with_merger if "visual" in t} and all("visual.merger" in t for t in with_merger if "visual" in t)
