"""The colocated teacher (a tiny model, loaded for real) and the choice of teacher."""

from __future__ import annotations

import pytest
import torch

from recipeforge.components.teacher import ColocatedTeacher, build_teacher, four_bit_config
from recipeforge.components.tokenizer import load_tokenizer
from recipeforge.config.schema.distill import TeacherConfig
from recipeforge.errors import RecipeError


def test_colocated_teacher_is_frozen_and_gives_top_k_log_probs():
    tok = load_tokenizer("tiny:llama")
    teacher = ColocatedTeacher(TeacherConfig(name_or_path="tiny:llama"), tok, device="cpu", dtype=torch.float32)
    assert not teacher.model.training
    assert not any(p.requires_grad for p in teacher.model.parameters())
    ids = torch.tensor([tok("the cow says moo")["input_ids"]])
    top = teacher.top_k(ids, torch.ones_like(ids), k=5, temperature=2.0)
    assert top.logprobs.shape == (*ids.shape, 5) and top.ids.dtype == torch.int64
    assert top.logprobs.dtype == torch.float32 and not top.logprobs.requires_grad
    full = torch.log_softmax(teacher.model(ids).logits.float() / 2.0, -1)
    torch.testing.assert_close(top.logprobs, full.topk(5, -1).values)
    # A left-padded row scores its tokens as the unpadded one does.
    padded = torch.cat([torch.zeros((1, 2), dtype=ids.dtype), ids], 1)
    mask = torch.cat([torch.zeros((1, 2), dtype=ids.dtype), torch.ones_like(ids)], 1)
    again = teacher.top_k(padded, mask, k=5, temperature=2.0)
    torch.testing.assert_close(again.logprobs[:, 2:], top.logprobs, atol=1e-5, rtol=1e-5)


def test_four_bit_teacher_is_refused_off_cuda():
    with pytest.raises(RecipeError) as exc:
        four_bit_config("cpu", torch.float32, location=None)
    assert exc.value.problems[0].key == "distill.teacher.load_in_4bit"


def test_a_served_teacher_that_cannot_be_reached_is_an_error_at_its_url():
    from service_testing import closed_port

    with pytest.raises(RecipeError) as exc:
        build_teacher(TeacherConfig(url=f"http://127.0.0.1:{closed_port()}/v1", timeout_s=2), None, device="cpu",
                      dtype=torch.float32)
    assert exc.value.problems[0].key == "distill.teacher.url"
