"""The `reward_model` GRPO reward takes what a `stage: reward` run writes: its run directory, final/
(full weights, or a LoRA adapter with its score head) or merged/; a causal LM is refused, since as a
classifier it would score with a random head."""

from __future__ import annotations

import json

import pytest

from recipeforge.components.rewards import RewardContext, reward_model
from recipeforge.errors import RecipeError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tok():
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(1024)


def _tiny(tok, num_labels=1):
    from recipeforge.components.models import build_tiny_model

    return build_tiny_model("llama", tok, seed=0, dtype=torch.float32, attn_implementation="eager",
                            num_labels=num_labels)


def _scores(model, tok, texts):
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits[:, 0]


TEXTS = ["What does the cow say? The cow says moo.", "What does the cow say? quack"]


def test_tiny_models_get_a_one_output_score_head(tok):
    model = _tiny(tok)
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    assert model.score.weight.shape == (1, 64)
    assert torch.equal(model.score.weight, _tiny(tok).score.weight)  # the seed decides the head too
    assert type(_tiny(tok, None)).__name__ == "LlamaForCausalLM"


@pytest.fixture(scope="module")
def lora_run(tok, tmp_path_factory):
    """A run directory as a LoRA reward run leaves it: base_model/, and final/ with the adapter (whose
    recorded base path no longer exists: the run was moved)."""
    from peft import LoraConfig, get_peft_model

    run = tmp_path_factory.mktemp("moved") / "run"
    base = _tiny(tok)
    base.save_pretrained(run / "base_model")
    tok.save_pretrained(run / "base_model")
    model = get_peft_model(_tiny(tok), LoraConfig(r=4, target_modules="all-linear", task_type="SEQ_CLS",
                                                  modules_to_save=["score"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    expected = _scores(model, tok, TEXTS)
    model.save_pretrained(run / "final")
    tok.save_pretrained(run / "final")
    cfg = json.loads((run / "final" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "/nowhere/else/base_model"
    (run / "final" / "adapter_config.json").write_text(json.dumps(cfg))
    return run, expected


@pytest.mark.parametrize("where", ["run", "final"])
def test_a_lora_reward_run_scores_with_its_trained_head(tok, lora_run, where):
    run, expected = lora_run
    built = reward_model({"path": str(run if where == "run" else run / "final")}, RewardContext())
    assert "peft" not in type(built.model).__module__  # merged once at load time
    got = _scores(built.model, built.tokenizer, TEXTS)
    assert torch.allclose(got, expected, atol=1e-5) and not torch.allclose(got[0], got[1])


def test_a_run_directory_prefers_merged(tok, tmp_path):
    model = _tiny(tok)
    for sub in ("final", "merged"):
        model.save_pretrained(tmp_path / sub)
        tok.save_pretrained(tmp_path / sub)
    with torch.no_grad():
        model.score.weight.mul_(-1)
    model.save_pretrained(tmp_path / "merged")
    built = reward_model({"path": str(tmp_path)}, RewardContext())
    assert torch.allclose(built.model.score.weight, model.score.weight)


def test_a_causal_lm_is_refused(tok, tmp_path):
    _tiny(tok, None).save_pretrained(tmp_path / "sft")
    tok.save_pretrained(tmp_path / "sft")
    with pytest.raises(RecipeError) as exc:
        reward_model({"path": str(tmp_path / "sft")}, RewardContext())
    assert "holds a causal LM (LlamaForCausalLM), not a reward model" in str(exc.value)


def test_a_causal_lm_adapter_is_refused(tok, tmp_path):
    from peft import LoraConfig, get_peft_model

    get_peft_model(_tiny(tok, None), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")) \
        .save_pretrained(tmp_path / "final")
    tok.save_pretrained(tmp_path / "final")
    with pytest.raises(RecipeError) as exc:
        reward_model({"path": str(tmp_path / "final")}, RewardContext())
    assert "holds a CAUSAL_LM adapter, not a reward model" in str(exc.value)
