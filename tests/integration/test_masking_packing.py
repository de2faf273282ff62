"""What the trainer really sees: SFT label masks, and packed samples that cannot see each other."""

from __future__ import annotations

import json
import random

import pytest

from recipeforge.components.packing import IGNORE, segment_ids


def _runner(tiny, name: str, run_dir, *overrides: str):
    """A stage runner after setup() (data, model, trainer built; nothing trained)."""
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan import make_plan
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import StageContext

    loaded = tiny.load(name, run_dir, *overrides)
    ctx = StageContext(loaded=loaded, plan=make_plan(loaded.recipe), run=RunDir(run_dir))
    runner = runner_class(loaded.recipe.stage)(ctx)
    runner.setup()
    return runner


def _source_rows(tiny, name):
    path = tiny.recipes.parent.parent / "data" / name
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("packing", ["true", "false"])
def test_sft_trains_only_on_assistant_tokens(tiny, tmp_path, packing):
    runner = _runner(tiny, "sft-full", tmp_path / "run", f"data.packing={packing}")
    tok = runner.tokenizer
    outputs = {row["output"] for row in _source_rows(tiny, "sft-alpaca.jsonl")}
    instructions = {row["instruction"] for row in _source_rows(tiny, "sft-alpaca.jsonl")}
    batch = next(iter(runner.trainer.get_train_dataloader()))
    checked = 0
    for i in range(batch["input_ids"].shape[0]):
        ids, labels = batch["input_ids"][i].tolist(), batch["labels"][i].tolist()
        if packing == "true":
            segs = segment_ids(batch["position_ids"][i].tolist())
        else:
            mask = batch["attention_mask"][i].tolist()
            segs = [0 if m else -1 for m in mask]
        for s in sorted(set(segs) - {-1}):
            idx = [j for j, g in enumerate(segs) if g == s]
            trained = [ids[j] for j in idx if labels[j] != IGNORE]
            ignored = [ids[j] for j in idx if labels[j] == IGNORE]
            assert all(labels[j] in (IGNORE, ids[j]) for j in idx)  # labels are the inputs, or ignored
            if not trained:
                assert all(t == tok.pad_token_id for t in ignored)  # only padding has nothing to learn
                continue
            answer = tok.decode(trained)
            assert answer.endswith(tok.eos_token)  # the reply and its turn end; the newline after it is prompt
            assert answer[: -len(tok.eos_token)] in outputs, answer
            prompt = tok.decode(ignored)
            assert any(q in prompt for q in instructions) and "assistant" in prompt
            checked += 1
    assert checked >= 8


def test_train_on_inputs_trains_the_prompt_too(tiny, tmp_path):
    runner = _runner(tiny, "sft-full", tmp_path / "run", "data.train_on_inputs=true", "data.packing=false")
    batch = next(iter(runner.trainer.get_train_dataloader()))
    real = batch["attention_mask"].bool()
    ignored = (batch["labels"] == IGNORE) & real
    assert ignored.sum() == 0  # every real token is a target


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_samples_do_not_see_each_other(tiny, tmp_path, attn):
    import torch

    runner = _runner(tiny, "sft-full", tmp_path / "run", f"model.attn_implementation={attn}")
    model = runner.trainer.model
    model.eval()
    batch = next(iter(runner.trainer.get_train_dataloader()))
    compared = 0
    with torch.no_grad():
        # The exact inputs the trainer passes to the model in a training step.
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        for i in range(batch["input_ids"].shape[0]):
            pos = batch["position_ids"][i].tolist()
            segs = segment_ids(pos)
            assert pos[0] == 0 and all(p == 0 for p, s, prev in zip(pos[1:], segs[1:], segs) if s != prev)
            for s in sorted(set(segs)):
                idx = [j for j, g in enumerate(segs) if g == s]
                ids = batch["input_ids"][i, idx]
                if (ids == runner.tokenizer.pad_token_id).all():
                    continue
                alone = model(input_ids=ids[None]).logits[0]
                torch.testing.assert_close(packed[i, idx], alone, atol=2e-5, rtol=1e-4)
                compared += 1
    assert compared >= 8  # several samples per packed row were checked


def test_packing_efficiency_on_a_synthetic_set(tmp_path):
    from recipeforge.components.collate import LMCollator
    from recipeforge.components.lm_data import prepare_lm_data
    from recipeforge.components.tokenizer import build_tiny_tokenizer
    from recipeforge.config import load_recipe

    rng = random.Random(0)
    words = "the cow dog cat says moo woof meow one two three red blue green apple".split()
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 150)))})
                            + "\n" for _ in range(2000)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"stage: pretrain\nmodel: {{name_or_path: 'tiny:llama'}}\n"
                      f"data: {{datasets: [{{path: {data}, format: text}}], sequence_len: 512, packing: true,"
                      f" cache_dir: {tmp_path / 'cache'}}}\ntrain: {{max_steps: 1}}\n")
    tok = build_tiny_tokenizer(1024)
    lm = prepare_lm_data(load_recipe(recipe).recipe, tok, base_dir=tmp_path, use_cache=False)
    assert lm.stats["packing_efficiency"] >= 0.95, lm.stats
    assert sum(len(r) for r in lm.train["input_ids"]) == lm.stats["train_tokens"]  # no token lost
    collate = LMCollator(tok.pad_token_id, packed=True)
    for start in range(0, len(lm.train), 8):
        collate([lm.train[j] for j in range(start, min(start + 8, len(lm.train)))])
    assert collate.counter.take()["padding_share"] <= 0.05
