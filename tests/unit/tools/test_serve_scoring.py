"""The scoring side of `recipeforge serve`, in this process: token-id prompts and `prompt_logprobs` as the
request parser reads them, the prompt log-probs of a small random Llama in vLLM's shape (against its own
log_softmax), and the mask of the positions a served teacher fills."""

from __future__ import annotations

import pytest
import torch

from recipeforge.components.served_teacher import scored_positions
from recipeforge.tools import openai_api as api
from recipeforge.tools.serve_scoring import prompt_logprobs


def _parse(**fields):
    return api.parse_request({"model": "m", **fields}, chat=False, served="m", max_logprobs=5)


def test_token_id_prompts_and_prompt_logprobs_are_read():
    assert _parse(prompt="text").prompt == "text" and _parse(prompt="text").token_prompts is None
    one = _parse(prompt=[1, 2, 3], prompt_logprobs=5)
    assert one.token_prompts == ((1, 2, 3),) and one.prompt_count == 1 and one.prompt_logprobs == 5
    batch = _parse(prompt=[[1], [2, 3]], prompt_logprobs=0)
    assert batch.token_prompts == ((1,), (2, 3)) and batch.prompt_count == 2 and batch.prompt_logprobs == 0
    assert _parse(prompt=[7]).prompt_logprobs is None


@pytest.mark.parametrize("fields, param", [
    ({"prompt": [1, True]}, "prompt"), ({"prompt": [1, 2.0]}, "prompt"), ({"prompt": [[1], [[2]]]}, "prompt"),
    ({"prompt": [[1]] * (api.MAX_PROMPTS + 1)}, "prompt"), ({"prompt": [[]]}, "prompt"), ({"prompt": []}, "prompt"),
    ({"prompt": [1], "prompt_logprobs": 6}, "prompt_logprobs"), ({"prompt": [1], "prompt_logprobs": 1.0}, "prompt_logprobs"),
    ({"prompt": [1], "prompt_logprobs": False}, "prompt_logprobs"),
    ({"prompt": [1], "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": [[1], [2]], "stream": True}, "stream"),
])
def test_malformed_scoring_fields_name_the_field(fields, param):
    with pytest.raises(api.BadRequest) as info:
        _parse(**fields)
    assert info.value.param == param and info.value.status == 400


def test_tokenize_requests():
    assert api.parse_tokenize({"prompt": "hi"}, served="m") == api.TokenizeRequest("hi")
    assert api.parse_tokenize({"model": "m", "prompt": "hi", "add_special_tokens": False},
                              served="m").add_special_tokens is False
    with pytest.raises(api.BadRequest) as info:
        api.parse_tokenize({"model": "other", "prompt": "hi"}, served="m")
    assert info.value.status == 404


class _Tokens:
    """A tokenizer of 40 ids, each decoded to its number."""

    def __len__(self) -> int:
        return 40

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)


def test_prompt_logprobs_are_the_models_distribution_in_vllms_shape():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    ids = [3, 17, 5, 44, 9]
    got = prompt_logprobs(model, _Tokens(), ids, 4)
    with torch.no_grad():
        want = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], dim=-1)
    assert got[0] is None and len(got) == len(ids)
    for t in range(1, len(ids)):
        entry, row = got[t], want[t - 1]
        top = row.topk(4)
        for rank, (token, value) in enumerate(zip(top.indices.tolist(), top.values.tolist()), 1):
            assert entry[str(token)]["rank"] == rank and entry[str(token)]["logprob"] == pytest.approx(value, abs=1e-5)
        own = entry[str(ids[t])]  # the prompt's own token, ranked in the whole vocabulary
        assert own["rank"] == int((row > row[ids[t]]).sum()) + 1
        assert own["logprob"] == pytest.approx(row[ids[t]].item(), abs=1e-5)
        assert len(entry) == 4 + (own["rank"] > 4)
    assert got[3]["44"]["decoded_token"] == "" and got[4]["9"]["decoded_token"] == "9"  # an id the model has and the tokenizer lacks
    assert prompt_logprobs(model, _Tokens(), ids, 0)[1] == {str(ids[1]): got[1][str(ids[1])]}


def test_scored_positions_are_real_tokens_followed_by_one():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]])
    assert scored_positions(mask).tolist() == [[True, True, False, False], [False, True, True, False],
                                               [False, False, False, False], [False, False, False, False]]
