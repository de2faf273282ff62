"""`preprocess` builds the tokenized cache ahead of training; its key follows data, tokenizer and options."""

from __future__ import annotations

import json
import shutil

from recipeforge.run import preprocess


def test_preprocess_then_train_hits_the_cache(tiny, tmp_path):
    stats = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}"))
    assert stats["cache"] == "miss" and stats["train_rows"] == 59 and stats["eval_rows"] == 8
    cache = tmp_path / "c" / "tokenized" / stats["fingerprint"]
    assert stats["cache_path"] == str(cache) and (cache / "stats.json").is_file()
    assert stats["packing_efficiency"] > 0.8 and stats["tokens_per_second"] > 0

    again = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}"))
    assert again["cache"] == "hit" and again["fingerprint"] == stats["fingerprint"]

    run = tiny.train("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}", "train.max_steps=2")
    data = tiny.records(run, "data")[0]
    assert data["cache"] == "hit" and data["train_tokens"] == stats["train_tokens"]


def test_fingerprint_changes_with_options_and_data(tiny, tmp_path):
    base = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}"))["fingerprint"]
    other_len = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}",
                                     "data.sequence_len=96"))["fingerprint"]
    other_mask = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}",
                                      "data.train_on_inputs=true"))["fingerprint"]
    assert len({base, other_len, other_mask}) == 3

    data = tmp_path / "copy.jsonl"
    shutil.copy(tiny.recipes.parent.parent / "data" / "sft-alpaca.jsonl", data)
    spec = f"data.datasets=[{{path: {data}, format: alpaca}}]"
    first = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}", spec))
    with open(data, "a") as fh:
        fh.write(json.dumps({"instruction": "What does the yak say?", "output": "The yak says hum."}) + "\n")
    second = preprocess(tiny.load("sft-full", tmp_path / "run", f"data.cache_dir={tmp_path / 'c'}", spec))
    assert first["fingerprint"] != second["fingerprint"] and second["cache"] == "miss"
    assert second["train_rows"] + second["eval_rows"] == first["train_rows"] + first["eval_rows"] + 1


def test_preprocess_checks_preference_and_prompt_rows(tiny, tmp_path):
    dpo = preprocess(tiny.load("dpo", tmp_path / "run"))
    assert dpo["train_rows"] == 40 and dpo["eval_rows"] == 8
    grpo = preprocess(tiny.load("grpo", tmp_path / "run"))
    assert grpo["train_rows"] == 32


def test_preprocess_command_ends_its_process_cleanly(tmp_path):
    """`python -m recipeforge preprocess` owns its process: it freezes its start-up objects (the garbage
    collector runs again after) and ends the process itself once the cache is written: the statistics
    are all printed, the exit code is 0 and atexit handlers (here one a wrapper registered) still run;
    the cache it wrote is complete (a second run hits it)."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    wrapper = textwrap.dedent("""
        import atexit, runpy, sys
        import gc
        atexit.register(lambda: print("ATEXIT_RAN", gc.isenabled(), gc.get_freeze_count() > 10000, file=sys.stderr))
        sys.argv = ["recipeforge", *sys.argv[1:]]
        runpy.run_module("recipeforge", run_name="__main__", alter_sys=True)
        print("NOT_REACHED", file=sys.stderr)
    """)
    recipe = root / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    env = {**__import__("os").environ, "PYTHONPATH": str(root), "RECIPEFORGE_CACHE": str(tmp_path / "rc")}
    runs = [subprocess.run([sys.executable, "-c", wrapper, "preprocess", str(recipe), f"data.cache_dir={tmp_path}"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300) for _ in range(2)]
    for proc, cache in zip(runs, ("miss", "hit")):
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the start-up objects were frozen out of the collector's way, and it runs again
        assert "ATEXIT_RAN True True" in proc.stderr and "NOT_REACHED" not in proc.stderr
        stats = json.loads(proc.stdout[proc.stdout.index("{"):])
        assert stats["cache"] == cache and stats["train_rows"] == 59


def test_preprocess_called_in_process_leaves_the_collector_alone(tiny, tmp_path, capsys):
    """`main([...])` (a caller's own process) neither freezes objects nor ends the process."""
    import gc

    from recipeforge.cli import main

    frozen = gc.get_freeze_count()
    recipe = tiny.recipes / "sft-full.yaml"
    assert main(["preprocess", str(recipe), f"data.cache_dir={tmp_path}", f"output.dir={tmp_path / 'run'}"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert json.loads(capsys.readouterr().out)["train_rows"] == 59
