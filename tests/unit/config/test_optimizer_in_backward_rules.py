"""`train.optimizer_in_backward`: what it cannot work with is refused at the key, with the fix."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL

KEY = "train.optimizer_in_backward"


def test_accepted_with_one_micro_batch_per_step_and_no_clipping(write):
    text = MINIMAL + "train: {optimizer_in_backward: true, max_grad_norm: null, global_batch_size: 4, micro_batch_size: 4}\n"
    assert load_recipe(write("r.yaml", text)).recipe.train.optimizer_in_backward is True


@pytest.mark.parametrize("train, extra, fragment, fix", [
    ("global_batch_size: 4", "", "gradient clipping (train.max_grad_norm: 1.0)", "train.max_grad_norm: null"),
    ("max_grad_norm: null, global_batch_size: 8, micro_batch_size: 2", "", "gradient accumulation",
     "train.micro_batch_size: 8"),
    ("max_grad_norm: null", "model: {name_or_path: tiny:llama, dtype: fp16}\n", "fp16", "model.dtype: bf16"),
    ("max_grad_norm: null", "distributed: {backend: ddp}\n", "distributed.backend is ddp",
     "distributed.backend: single"),
    ("max_grad_norm: null", "distributed: {backend: fsdp}\n", "distributed.backend is fsdp",
     "distributed.backend: single"),
])
def test_refused_at_the_key(write, train, extra, fragment, fix):
    text = MINIMAL.replace("model:\n  name_or_path: tiny:llama\n", "") if extra.startswith("model") else MINIMAL
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", text + f"train: {{optimizer_in_backward: true, {train}}}\n" + extra))
    found = {p.key: p for p in exc.value.problems}
    assert KEY in found, found
    assert fragment in found[KEY].message and fix in (found[KEY].hint or "")
    assert found[KEY].location is not None and found[KEY].location.line  # located in the file
