"""What `recipeforge serve` answers besides generated text, in vLLM's shapes: the log-probs of a prompt
(``prompt_logprobs`` of ``/v1/completions``) and the tokens of a text (``POST /tokenize``).

The log-probs at prompt position t are the model's distribution over the next token given the tokens
before t, at temperature 1 (the raw logits, whatever temperature the request samples its completion
at), from one forward pass over the whole prompt: the first position has none (null), every other one
holds the k most likely tokens (rank 1 to k) and the prompt's own token at t with its rank in the whole
vocabulary, keyed by token id as a string, as vLLM answers them. A log-prob of minus infinity is sent
as -9999.0, as vLLM does (JSON has no infinity).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from recipeforge.tools.openai_api import TokenizeRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from recipeforge.tools.chat import ChatModel

LOWEST_LOGPROB = -9999.0  # what vLLM sends for a log-prob of minus infinity


def prompt_logprobs(model: ChatModel, tokenizer: PreTrainedTokenizerBase, ids: list[int], k: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` for the token-id prompt `ids`: None, then one dict per later position
    ({token id: {logprob, rank, decoded_token}}) with the `k` most likely tokens and the prompt's own."""
    import torch

    with torch.inference_mode():
        tensor = torch.tensor([ids], dtype=torch.long, device=model.device)
        logits = model(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        actual = tensor[0, 1:]
        actual_logprobs = logprobs.gather(1, actual[:, None])[:, 0]
        ranks = (logprobs > actual_logprobs[:, None]).sum(dim=1) + 1
        top = logprobs.topk(k, dim=-1) if k else None
    names = _Decoded(tokenizer)
    actual_list, actual_lp, rank_list = actual.tolist(), actual_logprobs.tolist(), ranks.tolist()
    top_ids = top.indices.tolist() if top is not None else [[] for _ in actual_list]
    top_lps = top.values.tolist() if top is not None else [[] for _ in actual_list]
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for t, token in enumerate(actual_list):
        entry = {str(i): _logprob(lp, rank, names(i)) for rank, (i, lp) in enumerate(zip(top_ids[t], top_lps[t]), 1)}
        entry.setdefault(str(token), _logprob(actual_lp[t], rank_list[t], names(token)))
        out.append(entry)
    return out


def _logprob(value: float, rank: int, decoded: str) -> dict[str, Any]:
    finite = value if math.isfinite(value) else LOWEST_LOGPROB
    return {"logprob": max(finite, LOWEST_LOGPROB), "rank": int(rank), "decoded_token": decoded}


class _Decoded:
    """Each token id's text, decoded once per answer (the same ids recur at many positions); an id the
    model has but the tokenizer lacks (an embedding padded past the vocabulary) is the empty string."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer, self.size, self.cache = tokenizer, len(tokenizer), {}

    def __call__(self, token: int) -> str:
        if token not in self.cache:
            self.cache[token] = self.tokenizer.decode([token]) if token < self.size else ""
        return self.cache[token]


def tokenize(tokenizer: PreTrainedTokenizerBase, request: TokenizeRequest, *, context: int) -> dict[str, Any]:
    """vLLM's answer to ``POST /tokenize``: the text's token ids, their count and the model's context."""
    tokens = list(tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)["input_ids"])
    strs = tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
    return {"count": len(tokens), "max_model_len": context, "tokens": tokens, "token_strs": strs}
