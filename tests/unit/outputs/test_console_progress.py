"""The progress line's fields, and its in-place updates on a terminal (driven through the real
transformers callback objects, no training)."""

from __future__ import annotations

import io
import warnings

from recipeforge.outputs.console import Progress, format_progress, progress_callback
from recipeforge.outputs.library_warnings import WarningsRouter


def test_format_progress_fields():
    assert format_progress(12, 80, 3.21449, 1530.4, 62) == "step 12/80 | loss 3.2145 | 1,530 tok/s | ETA 0:01:02"
    assert format_progress(0, 80, None, None, None) == "step  0/80 | loss - | - tok/s | ETA -"


def test_speed_and_eta_from_the_clock():
    now = [100.0]
    p = Progress(total=10, clock=lambda: now[0])
    now[0], p.step = 102.0, 2
    p.update_log({"loss": 5.0}, counted=2000)
    assert p.tokens_per_second == 1000 and p.eta() == 8.0  # 1 s a step, 8 steps left
    now[0], p.step = 104.0, 4
    p.update_log({"loss": 4.0, "num_tokens": 9999.0}, counted=6000)  # a trainer's own count wins
    assert p.loss == 4.0 and p.tokens_per_second == (9999 - 2000) / 2


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_updates_the_line_in_place():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    out = _Tty()
    cb = progress_callback(out)
    args = TrainingArguments(output_dir="unused", report_to="none")
    state, control = TrainerState(max_steps=3), TrainerControl()
    cb.on_train_begin(args, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_end(args, state, control)
        cb.on_log(args, state, control, logs={"loss": 4.0 - step})
    cb.on_train_end(args, state, control)
    text = out.getvalue()
    assert text.count("\r\x1b[2K[recipeforge] step") >= 3 and text.endswith("\n")
    assert text.count("\n") == 1  # one line, rewritten
    assert "step 3/3 | loss 1.0000" in text.rsplit("\r", 1)[-1]


def test_library_warnings_are_held_until_the_run_dir_is_known(tmp_path):
    router = WarningsRouter()
    router.install()
    try:
        import json.decoder as library_module  # any stdlib module counts as library code

        warnings.warn_explicit("old api", FutureWarning, library_module.__file__, 1)
        assert router.pending and router.path is None
        log = router.attach(tmp_path)
        warnings.warn_explicit("older api", FutureWarning, library_module.__file__, 2)
        with warnings.catch_warnings(record=True) as shown:  # the user's own code: not routed
            warnings.simplefilter("always")
            warnings.warn_explicit("mine", UserWarning, str(tmp_path / "my_reward.py"), 3)
    finally:
        router.uninstall()
    text = log.read_text()
    assert "FutureWarning: old api" in text and "FutureWarning: older api" in text and "mine" not in text
    assert [str(w.message) for w in shown] == ["mine"]
