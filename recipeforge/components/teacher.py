"""Teachers of the `distill` stage: what every teacher gives (its top-k next-token log-probs), the
teacher loaded in the run (`ColocatedTeacher`), and `build_teacher`, which picks the recipe's.

A served teacher (`distill.teacher.url`) lives in `components.served_teacher` and implements the same
`Teacher` protocol (`components.teacher_topk`, which both import); it is imported only when a recipe
names one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from recipeforge.components.teacher_topk import Teacher, TeacherTopK
from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ColocatedTeacher", "Teacher", "TeacherTopK", "build_teacher"]

# The recipe's `distill.teacher` (`config.schema.distill.TeacherConfig`; components do not import config).
TeacherConfig = Any

Locate = Callable[[tuple[Any, ...]], "Location | None"]
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _no_locate(path: tuple[Any, ...]) -> Location | None:
    return None


class ColocatedTeacher:
    """A teacher loaded in the run with transformers: frozen, in eval mode, on the student's device and
    in its dtype (4-bit NF4 with `load_in_4bit`, CUDA only)."""

    def __init__(self, config: TeacherConfig, tokenizer: PreTrainedTokenizerBase, *, device: str, dtype: torch.dtype,
                 trust_remote_code: bool = False, attn_implementation: str = "auto", seed: int = 42,
                 locate: Locate = _no_locate):
        from recipeforge.components.models import load_model

        assert config.name_or_path is not None
        quant = None
        if config.load_in_4bit:
            quant = four_bit_config(device, dtype, location=locate(("distill", "teacher", "load_in_4bit")))
        self.name = config.name_or_path
        self.model = load_model(config.name_or_path, tokenizer, device=device, dtype=_DTYPE_NAMES.get(dtype, "auto"),
                                attn_implementation=attn_implementation, revision=config.revision,
                                trust_remote_code=trust_remote_code, seed=seed, quantization_config=quant,
                                location=locate(("distill", "teacher", "name_or_path")))
        self.model.eval()
        self.model.requires_grad_(False)
        if getattr(self.model.config, "use_cache", None):
            self.model.config.use_cache = False

    @property
    def vocab_size(self) -> int:
        """Rows of the teacher's output layer."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def top_k(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, k: int,
              temperature: float) -> TeacherTopK:
        """The teacher's k most likely next tokens at every position, at `temperature`."""
        device = next(self.model.parameters()).device
        mask = attention_mask.to(device)
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)  # left- or right-padded rows alike
        with torch.no_grad():
            logits = self.model(input_ids=input_ids.to(device), attention_mask=mask, position_ids=positions).logits
            logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
            top = logprobs.topk(min(k, logprobs.size(-1)), dim=-1)
        return TeacherTopK(logprobs=top.values, ids=top.indices.long())


def four_bit_config(device: str, dtype: torch.dtype, *, location: Location | None) -> Any:
    """The bitsandbytes NF4 config of a 4-bit teacher; refused off CUDA."""
    if device != "cuda":
        raise RecipeError(f"a 4-bit teacher needs bitsandbytes on a CUDA GPU, and this run is planned for {device}",
                          key="distill.teacher.load_in_4bit", location=location,
                          hint="set distill.teacher.load_in_4bit: false, or train on a GPU")
    from recipeforge.components.adapters import check_bitsandbytes

    check_bitsandbytes(device, what="a 4-bit teacher", key="distill.teacher.load_in_4bit", location=location)
    from transformers import BitsAndBytesConfig

    compute = dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute,
                              bnb_4bit_use_double_quant=True)


def build_teacher(config: TeacherConfig, tokenizer: PreTrainedTokenizerBase, *, device: str, dtype: torch.dtype,
                  trust_remote_code: bool = False, attn_implementation: str = "auto", seed: int = 42,
                  vocab_size: int | None = None, locate: Locate = _no_locate) -> Teacher:
    """The recipe's teacher: `ColocatedTeacher` for `name_or_path`, the served teacher for `url`."""
    if config.url is None:
        return ColocatedTeacher(config, tokenizer, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                attn_implementation=attn_implementation, seed=seed, locate=locate)
    from recipeforge.components.served_teacher import ServedTeacher

    # The server's /tokenize must split a probe text as the student's tokenizer does (vLLM's and
    # `recipeforge serve`'s add the tokenizer's special tokens, as `encode` does by default).
    teacher: Teacher = ServedTeacher(config, vocab_size=vocab_size,
                                     probe=tokenizer.encode if tokenizer is not None else None)
    return teacher
