"""Nothing a recipe or a command line names runs Python code without the opt-in (`allow_code: true` or
`--trust-code`), whichever door the code comes through; with the opt-in the same code does run, so the
gate is the only thing in between.

Each hostile file would create a marker file if its code ran: an lm-eval task config with a `!function`
(the shape of the first report), one whose only code is a Jinja template (lm-eval renders templates
unsandboxed), one that pulls the code in through an `include:` chain, a recipe whose `eval.tasks` names
such a config, `model.trust_remote_code`, a reward model's `trust_remote_code`, a run whose recorded
recipe asks `merge` for remote code, and a chat template reaching for Python (transformers' sandbox
refuses it: no opt-in can make a chat template run code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surface_testing import recipeforge, refused

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TASK_ROWS = [{"prompt": "The sky is", "choices": ["blue", "green"], "answer": 0},
             {"prompt": "A cat says", "choices": ["meow", "moo"], "answer": 0}]


def _task(folder: Path, name: str, extra: str) -> Path:
    """An lm-eval multiple-choice task config on a local JSONL file, plus `extra` lines."""
    rows = folder / f"{name}.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in TASK_ROWS))
    path = folder / f"{name}.yaml"
    path.write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {rows}\n"
                    "test_split: test\noutput_type: multiple_choice\ndoc_to_choice: '{{choices}}'\n"
                    "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n" + extra)
    return path


@pytest.fixture
def hostile(tmp_path) -> dict[str, tuple[Path, Path]]:
    """door -> (task config, the marker its code touches): by !function, by a template, through an include."""
    def module(folder: Path, marker: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                        "def process_docs(ds):\n    return ds\n")

    doors = {}
    folder = tmp_path / "function"
    module(folder, tmp_path / "RAN-function")
    doors["function"] = (_task(folder, "by_function", "doc_to_text: '{{prompt}}'\n"
                                                      "process_docs: !function evil.process_docs\n"),
                         tmp_path / "RAN-function")
    folder = tmp_path / "template"
    folder.mkdir()
    touch = f"{{{{ cycler.__init__.__globals__.os.system('touch {tmp_path / 'RAN-template'}') }}}}{{{{prompt}}}}"
    doors["template"] = (_task(folder, "by_template", f"doc_to_text: \"{touch}\"\n"), tmp_path / "RAN-template")
    folder = tmp_path / "include"
    module(folder / "base", tmp_path / "RAN-include")
    (folder / "base" / "common.yaml").write_text("process_docs: !function evil.process_docs\n")
    doors["include"] = (_task(folder, "by_include", "doc_to_text: '{{prompt}}'\ninclude: base/common.yaml\n"),
                        tmp_path / "RAN-include")
    return doors


def test_an_lm_eval_task_config_runs_only_with_the_opt_in(hostile, full_run, tmp_path):
    for door, (task, marker) in hostile.items():
        err = refused(recipeforge("eval", str(full_run), "--tasks", str(task), "--limit", "2", cwd=tmp_path),
                      str(task), "needs an opt-in", "--trust-code")
        assert "--tasks" in err.splitlines()[0], door
        # A recipe naming the same file in eval.tasks is refused at validate, before any training.
        recipe = task.parent / "r.yaml"
        recipe.write_text(f"extends: {DATA.parent / 'yaml' / 'tiny' / 'sft-full.yaml'}\n"
                          f"eval: {{tasks: [{task.name}], after_training: false}}\n")
        refused(recipeforge("validate", str(recipe), cwd=tmp_path), "eval.tasks[0]", "needs an opt-in")
        assert not marker.exists(), door
    # The opt-in, typed after the command as the hint suggests: each file's code runs (the gate was all
    # there was between it and the machine).
    tasks = [str(task) for task, _ in hostile.values()]
    done = recipeforge("eval", str(full_run), "--tasks", *tasks, "--limit", "2", "--trust-code", cwd=tmp_path)
    for door, (_, marker) in hostile.items():
        assert marker.exists(), f"{door}: {done.stderr.decode()[-3000:]}"


def test_code_named_by_a_recipe_needs_the_opt_in(tmp_path, lora_run):
    # model.trust_remote_code: the model repository's own Python files.
    recipe = tmp_path / "remote.yaml"
    recipe.write_text(f"extends: {DATA.parent / 'yaml' / 'tiny' / 'sft-full.yaml'}\nmodel: {{trust_remote_code: true}}\n")
    refused(recipeforge("validate", str(recipe), cwd=tmp_path), "model.trust_remote_code", "needs an opt-in",
            "allow_code: true")
    assert recipeforge("validate", str(recipe), "--trust-code", cwd=tmp_path).returncode == 0
    recipe.write_text(recipe.read_text() + "allow_code: true\n")
    assert recipeforge("validate", str(recipe), cwd=tmp_path).returncode == 0
    # A reward model loaded with trust_remote_code.
    grpo = tmp_path / "grpo.yaml"
    grpo.write_text(f"extends: {DATA.parent / 'yaml' / 'tiny' / 'grpo.yaml'}\ngrpo:\n  rewards:\n"
                    f"    - {{name: reward_model, args: {{path: {lora_run}, trust_remote_code: true}}}}\n")
    refused(recipeforge("validate", str(grpo), cwd=tmp_path), "grpo.rewards[0].args.trust_remote_code",
            "needs an opt-in")
    # A run whose recorded recipe asks for remote code: `merge` loads its base with it, so it asks too.
    recorded = lora_run / "resolved_recipe.yaml"
    text = recorded.read_text()
    try:
        recorded.write_text(text.replace("trust_remote_code: false", "trust_remote_code: true"))
        refused(recipeforge("merge", str(lora_run), "-o", str(tmp_path / "merged"), cwd=tmp_path),
                "model.trust_remote_code", "needs an opt-in")
        assert not (tmp_path / "merged").exists()
    finally:
        recorded.write_text(text)


def test_a_chat_template_cannot_reach_python(tmp_path):
    marker = tmp_path / "CODE-RAN"
    (tmp_path / "evil.jinja").write_text(
        f"{{% for m in messages %}}{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"
        "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                                  {"role": "assistant", "content": "moo"}]}) + "\n")
    recipe = tmp_path / "t.yaml"
    recipe.write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\nhardware: {gpus_per_node: 0}\n"
                      "data:\n  datasets: [{path: chat.jsonl, format: messages}]\n  chat_template: evil.jinja\n"
                      f"  cache_dir: {tmp_path / 'cache'}\nallow_code: true\n")
    # Even with the opt-in: transformers renders chat templates in Jinja's sandbox.
    refused(recipeforge("preprocess", str(recipe), "--trust-code", cwd=tmp_path), "data.chat_template", "unsafe")
    assert not marker.exists()
