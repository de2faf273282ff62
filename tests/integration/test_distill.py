"""Knowledge distillation end to end on tiny models: a tiny teacher learns the SFT rows, then a smaller
student (one layer, half the width, the teacher's tokenizer) is distilled from it and, for comparison,
trained by plain SFT on the same rows for the same steps. On held-out rows the distilled student must
be closer to the teacher (KL) than the SFT one."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROWS = Path(__file__).resolve().parents[2] / "examples" / "data" / "sft-alpaca.jsonl"
STEPS = 40
QUIET = ("data.val_size=0", "train.eval_steps=null", "train.logging_steps=5", "data.packing=false")


def _split(tmp: Path) -> tuple[Path, list[dict]]:
    """Every fifth row held out of the students' training; the rest written to a file they train on."""
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    train = tmp / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i % 5))
    return train, [r for i, r in enumerate(rows) if i % 5 == 0]


def _student_base(teacher: Path, where: Path) -> Path:
    """A random-init student architecture: the teacher's config, one layer and half the width, and its tokenizer."""
    where.mkdir(parents=True)
    cfg = json.loads((teacher / "config.json").read_text())
    small = {k: cfg[k] for k in ("model_type", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
                                 "bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    small.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1)
    (where / "config.json").write_text(json.dumps(small))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (teacher / name).exists():
            shutil.copy(teacher / name, where / name)
    return where


def _held_out_kl(teacher: Path, student: Path, rows: list[dict]) -> float:
    """Mean full-vocabulary KL(teacher || student) over the answer tokens of `rows` (chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(teacher))
    t = AutoModelForCausalLM.from_pretrained(str(teacher)).eval()
    s = AutoModelForCausalLM.from_pretrained(str(student)).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            chat = [{"role": "user", "content": row["instruction"]}]
            prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
            full = tok.apply_chat_template(chat + [{"role": "assistant", "content": row["output"]}], tokenize=True,
                                           return_dict=True)
            ids = torch.tensor([full["input_ids"]])
            start = len(prompt["input_ids"])
            p = torch.log_softmax(t(ids).logits[0, start - 1:-1].float(), -1)
            q = torch.log_softmax(s(ids).logits[0, start - 1:-1].float(), -1)
            total += float((p.exp() * (p - q)).sum())
            count += p.size(0)
    return total / count


def test_distilled_student_is_closer_to_the_teacher_than_sft(tiny, tmp_path):
    train, held = _split(tmp_path)
    teacher = tiny.train("sft-full", tmp_path / "teacher", "train.max_steps=60", "output.save_steps=60",
                         "data.val_size=0", "train.eval_steps=null") / "final"
    base = _student_base(teacher, tmp_path / "student-base")
    data = f"data.datasets=[{{path: {train}, format: alpaca}}]"
    student = (f"model.name_or_path={base}", "model.init=random", f"train.max_steps={STEPS}",
               f"output.save_steps={STEPS}", data, *QUIET)
    distilled = tiny.train("distill", tmp_path / "distilled", *student, f"distill.teacher.name_or_path={teacher}")
    sft = tiny.train("sft-full", tmp_path / "sft", *student)

    kl = tiny.values(distilled, "distill/kl")
    mass = tiny.values(distilled, "distill/teacher_mass")
    print(f"distill/kl over training: {[round(v, 3) for v in kl]}; teacher top-20 mass {mass[-1]:.3f}")
    assert len(kl) >= 3 and kl[-1] < 0.7 * kl[0], kl
    assert all(0 < m <= 1 for m in mass)

    figures = {name: _held_out_kl(teacher, run / "final", held) for name, run in (("distilled", distilled),
                                                                                  ("sft", sft))}
    print(f"held-out KL(teacher || student) on {len(held)} rows: distilled {figures['distilled']:.4f}, "
          f"sft {figures['sft']:.4f}")
    assert figures["distilled"] < figures["sft"], figures


def test_on_policy_distillation_trains_and_logs(tiny, tmp_path):
    teacher = tiny.train("sft-full", tmp_path / "teacher", "train.max_steps=10", "output.save_steps=10",
                         "data.val_size=0", "train.eval_steps=null") / "final"
    run = tiny.train("distill", tmp_path / "run", *QUIET, f"distill.teacher.name_or_path={teacher}",
                     "distill.on_policy=0.5", "distill.max_new_tokens=8", "distill.loss=jsd", "train.max_steps=8",
                     "output.save_steps=8", "train.logging_steps=1")
    records = [r for r in tiny.records(run, "train") if "distill/kl" in r]
    assert len(records) == 8
    shares = [r["distill/on_policy"] for r in records]
    assert 0 < sum(shares) < len(shares), shares  # some steps sampled, some did not
    assert all(math.isfinite(r["loss"]) and r["distill/kl"] >= 0 for r in records)
    assert (run / "final" / "model.safetensors").is_file()
