"""A served distillation teacher: `ServedTeacher` asks a real `recipeforge serve` of a tiny trained run for
the top-k next tokens of a padded batch, and gets what the same model loaded in this process with
transformers gives (log_softmax of its logits, topk): the same ids, log-probs within 1e-4, placeholders
where nothing is predicted. A limit below top_k, a wrong or missing key, a temperature other than 1, a
server that cannot be reached, a tokenizer that differs and a server that silently returns fewer log-probs
are each one `RecipeError` at the key to fix."""

from __future__ import annotations

import json
import math

import pytest
import torch

from recipeforge.components.served_teacher import ServedTeacher, scored_positions
from recipeforge.config.schema.distill import TeacherConfig
from recipeforge.errors import RecipeError
from serve_testing import start_serve
from service_testing import Endpoint, Reply, closed_port, serving

pytestmark = pytest.mark.slow
KEY = "rf-teacher-k3y-0123"
LIMIT = 8  # the server's --max-logprobs


@pytest.fixture(scope="module")
def teacher_server(tiny, tmp_path_factory):
    run = tiny.train("sft-full", tmp_path_factory.mktemp("teacher") / "teacher-run", "train.max_steps=30",
                     "data.val_size=0")
    server = start_serve(run, "--max-logprobs", str(LIMIT), env={"RECIPEFORGE_API_KEY": KEY})
    yield run, server.url
    server.stop()


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("RF_TEACHER_KEY", KEY)
    return "RF_TEACHER_KEY"


def test_top_k_is_the_models_own_distribution(teacher_server, key_env):
    from recipeforge.tools.chat import load_chat_model

    run, url = teacher_server
    model, tokenizer = load_chat_model(run, device="cpu")
    teacher = ServedTeacher(TeacherConfig(url=url, api_key_env=key_env), vocab_size=len(tokenizer),
                            probe=tokenizer.encode)  # the server's /tokenize agrees with the student's tokenizer
    assert teacher.model == run.name
    rows = [tokenizer.encode("The dog says woof and the cow says moo"), tokenizer.encode("Hello there"),
            tokenizer.encode("A")[:1], []]
    length = max(len(r) for r in rows) + 2
    ids, mask = torch.zeros(len(rows), length, dtype=torch.long), torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):  # right padding, left padding, one token, nothing
        start = length - len(row) if b == 1 else 0
        ids[b, start:start + len(row)], mask[b, start:start + len(row)] = torch.tensor(row, dtype=torch.long), 1
    k = LIMIT
    got = teacher.top_k(ids, mask, k=k, temperature=1.0)
    assert got.ids.shape == got.logprobs.shape == (len(rows), length, k)
    assert got.ids.dtype == torch.int64 and got.logprobs.dtype == torch.float32
    scored = scored_positions(mask)
    for b, row in enumerate(rows):
        positions = mask[b].nonzero().flatten()
        assert scored[b].sum() == max(len(row) - 1, 0)
        if len(row) > 1:
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=torch.tensor([row])).logits[0].float(), dim=-1)
            want = logprobs.topk(k, dim=-1)
            here = positions[:-1]  # the last real token predicts beyond the row
            assert torch.equal(got.ids[b, here], want.indices[:-1]), b
            assert torch.allclose(got.logprobs[b, here], want.values[:-1], atol=1e-4, rtol=0), b
    # Where nothing is predicted: the uniform placeholder over ids 0..k-1.
    assert torch.equal(got.ids[~scored], torch.arange(k).expand(int((~scored).sum()), k))
    assert torch.allclose(got.logprobs[~scored], torch.full((int((~scored).sum()), k), -math.log(k)))


def test_refusals_name_the_key_to_fix(teacher_server, key_env, monkeypatch):
    run, url = teacher_server
    teacher = ServedTeacher(TeacherConfig(url=url, api_key_env=key_env, served_model=run.name))
    batch, mask = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(RecipeError, match="greater than max allowed: 8") as info:  # the server's --max-logprobs
        teacher.top_k(batch, mask, k=LIMIT + 1, temperature=1.0)
    assert info.value.problems[0].key == "distill.teacher.url" and "--max-logprobs" in info.value.problems[0].hint
    with pytest.raises(RecipeError, match="temperature 1") as info:
        teacher.top_k(batch, mask, k=2, temperature=2.0)
    assert info.value.problems[0].key == "distill.temperature"
    monkeypatch.setenv("RF_WRONG_KEY", "not-the-key")
    with pytest.raises(RecipeError, match="refused the API key"):
        ServedTeacher(TeacherConfig(url=url, api_key_env="RF_WRONG_KEY"))
    with pytest.raises(RecipeError, match="RF_UNSET_KEY") as info:
        ServedTeacher(TeacherConfig(url=url, api_key_env="RF_UNSET_KEY"))
    assert info.value.problems[0].key == "distill.teacher.api_key_env"
    with pytest.raises(RecipeError, match="same tokenizer") as info:
        ServedTeacher(TeacherConfig(url=url, api_key_env=key_env), probe=lambda text: [1, 2, 3])
    assert info.value.problems[0].key == "distill.teacher.url"
    with pytest.raises(RecipeError, match="cannot be reached") as info:
        ServedTeacher(TeacherConfig(url=f"http://127.0.0.1:{closed_port()}/v1", served_model="m"),
                      probe=lambda text: [1])
    assert "recipeforge serve" in info.value.problems[0].hint


def test_a_server_that_returns_fewer_logprobs_than_asked(tmp_path):
    """A server that caps the log-probs without saying so (answers 2 where 4 were asked)."""
    entry = {"11": {"logprob": -0.5, "rank": 1, "decoded_token": "a"},
             "12": {"logprob": -1.5, "rank": 2, "decoded_token": "b"},
             "7": {"logprob": -6.0, "rank": 40, "decoded_token": "c"}}  # the prompt's own token, ranked 40th
    answer = {"object": "text_completion", "choices": [
        {"index": 0, "text": "x", "finish_reason": "length", "prompt_logprobs": [None, entry, entry]}]}
    endpoint = Endpoint(routes={("POST", "/v1/completions"): Reply(200, json.dumps(answer).encode())})
    with serving(endpoint):
        teacher = ServedTeacher(TeacherConfig(url=endpoint.url + "/v1", served_model="m"))
        assert teacher.top_k(torch.tensor([[7, 7, 7]]), torch.ones(1, 3), k=2, temperature=1.0).ids[0, 0].tolist() \
            == [11, 12]
        with pytest.raises(RecipeError, match="returned 2 log-probs at row 0, position 1, fewer than distill.top_k = 4"
                           ) as info:
            teacher.top_k(torch.tensor([[7, 7, 7]]), torch.ones(1, 3), k=4, temperature=1.0)
    assert "--max-logprobs" in info.value.problems[0].hint


def test_distillation_from_the_served_teacher_trains_as_from_the_loaded_one(teacher_server, key_env, tiny, tmp_path):
    """`recipeforge serve` of the teacher run as `distill.teacher.url`: the student trains, and on the same
    seed its per-step divergence is the one a run with the same teacher loaded in-process logs (served and
    colocated teachers train one objective)."""
    run, url = teacher_server
    common = ("train.max_steps=6", "output.save_steps=6", "data.val_size=0", "train.eval_steps=null",
              "train.logging_steps=1", f"distill.top_k={LIMIT}",
              "train.seed=7")  # a student initialized unlike the teacher (tiny:llama from the default seed)
    served = tiny.train("distill", tmp_path / "served", *common, f"distill.teacher.url={url}",
                        "~distill.teacher.name_or_path", f"distill.teacher.api_key_env={key_env}")
    loaded = tiny.train("distill", tmp_path / "loaded", *common, f"distill.teacher.name_or_path={run / 'final'}")
    kl_served, kl_loaded = tiny.values(served, "distill/kl"), tiny.values(loaded, "distill/kl")
    print(f"distill/kl, served teacher: {[round(v, 4) for v in kl_served]}; loaded: {[round(v, 4) for v in kl_loaded]}")
    assert len(kl_served) == len(kl_loaded) == 6
    assert kl_served[-1] < kl_served[0], kl_served
    assert math.isclose(kl_served[0], kl_loaded[0], rel_tol=1e-3), (kl_served[0], kl_loaded[0])
    assert all(math.isclose(a, b, rel_tol=5e-2) for a, b in zip(kl_served, kl_loaded)), (kl_served, kl_loaded)
    assert (served / "final" / "model.safetensors").is_file()
