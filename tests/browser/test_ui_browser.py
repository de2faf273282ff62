"""`recipeforge ui` in a real browser: Playwright drives Debian's Chromium (/usr/bin/chromium; no browser is
downloaded) against ``python -m recipeforge ui`` started as a user starts it, on a runs folder holding a
finished tiny run and one still training. The running run's chart gains points; a broken edit shows its
located error at its line; the fixed edit shows the plan; the form view sets a key in the YAML text and shows
the located error at its field; a run launched from the editor appears in the
list, and Stop preempts it (a checkpoint saved, shown "preempted"). `.ci/ui` installs both and runs this
folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("RECIPEFORGE_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).is_file():
    if "RECIPEFORGE_CHROMIUM" in os.environ:  # named by .ci/ui, which installed it: missing is a failure
        pytest.fail(f"RECIPEFORGE_CHROMIUM names {CHROMIUM}, which is not a file", pytrace=False)
    # a contributor's machine without Chromium: the browser tier needs it (apt-get install chromium; .ci/ui does)
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/ui does)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "yaml" / "tiny"
QUIET = ["logging.progress_bar=false"]
LONG = ["train.max_steps=3000", "train.logging_steps=1", "output.save_steps=1000", *QUIET]


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "RECIPEFORGE_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}


def _train(recipe: Path, out: Path, extra: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={out}",
                                 *extra], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=out.parent.parent)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A runs folder with a finished and a running tiny run, the tiny recipes beside it, and the UI on it."""
    tmp = tmp_path_factory.mktemp("ui")
    recipes, runs = tmp / "recipes" / "tiny", tmp / "runs"
    recipes.mkdir(parents=True)
    runs.mkdir()
    for name in ("base.yaml", "sft-lora.yaml"):
        shutil.copy(TINY / name, recipes / name)
    (tmp / "data").mkdir()
    shutil.copy(REPO / "examples" / "data" / "sft-chat.jsonl", tmp / "data" / "sft-chat.jsonl")
    env = _env(tmp)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "recipeforge", "train", str(recipes / "sft-lora.yaml"),
                           f"output.dir={runs / 'finished'}", "train.max_steps=4", "train.logging_steps=1",
                           "output.save_steps=2", *QUIET], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    running = _train(recipes / "sft-lora.yaml", runs / "running", LONG, env, tmp / "running.log")
    ui = subprocess.Popen([sys.executable, "-m", "recipeforge", "ui", str(runs), "--recipes", str(tmp / "recipes"),
                           "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp, text=True)
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        match = re.search(r"http://\S+/", line)
        assert match, line
        yield {"url": match.group(0), "runs": runs, "running": running, "started": started}
    finally:
        _stop(running)
        ui.send_signal(signal.SIGTERM)
        ui.wait(30)
        holder = runs / "launched" / ".recipeforge.lock"
        if holder.is_file():  # the run launched from the page, when a failed test left it training
            try:
                os.kill(int(json.loads(holder.read_text())["pid"]), signal.SIGTERM)
            except (ValueError, KeyError, ProcessLookupError):
                pass


@pytest.fixture(scope="module")
def page(site: dict[str, object]) -> Iterator[object]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(str(site["url"]))
        yield page
        browser.close()


def _points(page) -> int:
    return int(page.get_attribute("#chart-loss", "data-points") or 0)


def test_runs_listed_with_status_and_the_running_chart_gains_points(site, page):
    expect = playwright.expect
    expect(page.locator('tr[data-run="finished"] td.state')).to_have_text("finished", timeout=30_000)
    expect(page.locator('tr[data-run="running"] td.state')).to_have_text("running", timeout=120_000)
    page.click('tr[data-run="finished"]')
    expect(page.locator("#run-state")).to_have_text("finished")
    expect(page.locator("#chart-loss")).to_have_attribute("data-points", "4", timeout=10_000)
    expect(page.locator("#run-plan")).to_contain_text("backend")
    expect(page.locator("#run-recipe")).to_contain_text("stage: sft")
    page.click('tr[data-run="running"]')
    expect(page.locator("#run-state")).to_have_text("running")
    page.wait_for_function("Number(document.querySelector('#chart-loss').dataset.points) > 0", timeout=120_000)
    first = _points(page)
    page.wait_for_function(f"Number(document.querySelector('#chart-loss').dataset.points) > {first}", timeout=60_000)
    assert _points(page) > first
    # The diff of the two runs' recipes: what `recipeforge diff` prints (max_steps, output.save_steps differ).
    page.select_option("#diff-a", "finished")
    page.select_option("#diff-b", "running")
    page.click("#diff-go")
    expect(page.locator("#diff-out")).to_contain_text("max_steps")


def test_editor_shows_the_located_error_then_the_plan(page):
    expect = playwright.expect
    page.click("#tab-editor")
    page.select_option("#recipe-select", "tiny/sft-lora.yaml")
    page.click("#recipe-open")
    expect(page.locator("#errors li.ok")).to_contain_text("valid: sft recipe", timeout=30_000)
    text = page.input_value("#recipe-text")
    line = text.splitlines().index("  learning_rate: 1.0e-2") + 1
    page.fill("#recipe-text", text.replace("learning_rate: 1.0e-2", "learning_rate: fast"))
    error = page.locator('#errors li.error[data-key="train.learning_rate"]')
    expect(error).to_contain_text(f"sft-lora.yaml:{line}:", timeout=30_000)
    expect(error).to_contain_text("expected a number")
    expect(page.locator(f'#gutter .ln.error[data-line="{line}"]')).to_have_count(1)
    expect(page.locator("#plan")).to_contain_text("no plan")
    page.fill("#hardware", "1xH100-80GB")
    page.fill("#recipe-text", text)
    expect(page.locator("#errors li.ok")).to_contain_text("valid", timeout=30_000)
    expect(page.locator("#plan")).to_contain_text("Plan: single on 1xH100-80GB", timeout=30_000)
    expect(page.locator("#plan")).to_contain_text("Memory per GPU")
    expect(page.locator("#gutter .ln.error")).to_have_count(0)


def test_the_form_sets_a_key_in_the_yaml_and_shows_its_error_at_the_field(page):
    expect = playwright.expect
    text = page.input_value("#recipe-text")
    page.click("#view-form")
    expect(page.locator("#form-view")).to_be_visible()
    expect(page.locator("#form-state")).to_contain_text("sft recipe", timeout=30_000)
    # The value the recipe resolves to (from its parent, base.yaml), and the file's own keys marked.
    field = page.locator('#form .field[data-key="train.max_steps"]')
    steps = field.locator("input")
    expect(steps).to_have_value("40")
    expect(field.locator(".origin")).to_have_text("from extends")
    expect(page.locator('#form .field[data-key="train.learning_rate"] .origin')).to_have_text("set here")
    expect(page.locator('#form .field[data-key="train.optimizer"] select')).to_have_value('"adamw"')
    # An invalid value: the check's located error shows at the field, and there is no plan.
    steps.fill("0")
    steps.press("Tab")
    expect(field.locator(".field-error")).to_contain_text("train.max_steps", timeout=30_000)
    expect(field.locator(".field-error")).to_contain_text("sft-lora.yaml:")
    expect(field).to_have_class(re.compile(r"\binvalid\b"))
    expect(page.locator("#plan")).to_contain_text("no plan")
    # Fixed: the plan again, the field marked as set here, and the YAML holds the new value under train:.
    steps.fill("12")
    steps.press("Tab")
    expect(page.locator("#errors li.ok")).to_contain_text("valid", timeout=30_000)
    expect(page.locator("#plan")).to_contain_text("Plan: single on 1xH100-80GB", timeout=30_000)
    expect(field.locator(".field-error")).to_have_text("")
    expect(field.locator(".origin")).to_have_text("set here", timeout=30_000)
    page.click("#view-yaml")
    edited = page.input_value("#recipe-text")
    lines = text.splitlines()
    at = lines.index("  learning_rate: 1.0e-2") + 1
    assert edited.splitlines() == [*lines[:at], "  max_steps: 12", *lines[at:]]
    expect(page.locator("#save-state")).to_have_text("unsaved changes")
    page.fill("#recipe-text", text)  # as opened, for the launch below
    expect(page.locator("#errors li.ok")).to_contain_text("valid", timeout=30_000)


def test_launch_from_the_editor_then_stop_preempts(site, page):
    expect = playwright.expect
    page.fill("#run-name-input", "launched")
    page.fill("#overrides", "\n".join(LONG))
    # The command the launch runs, shown before it starts (one line to copy).
    command = page.locator("#command")
    expect(command).to_contain_text(f"output.dir={site['runs'] / 'launched'}", timeout=10_000)
    expect(command).to_contain_text("-m recipeforge train")
    expect(command).to_contain_text("train.max_steps=3000")
    page.click("#launch")
    expect(page.locator('tr[data-run="launched"]')).to_have_count(1, timeout=30_000)
    expect(page.locator("#run-name")).to_have_text("launched")
    expect(page.locator("#run-state")).to_have_text("running", timeout=60_000)
    # Stop once it trains (a step logged), so the stop lands in training and saves a checkpoint.
    page.wait_for_function("Number(document.querySelector('#chart-loss').dataset.points) > 0", timeout=180_000)
    expect(page.locator("#stop")).to_be_visible()
    page.click("#stop")
    expect(page.locator('tr[data-run="launched"] td.state')).to_have_text("preempted", timeout=120_000)
    expect(page.locator("#run-state")).to_have_text("preempted")
    expect(page.locator("#run-progress")).to_contain_text("checkpoint-")
    run = Path(site["runs"]) / "launched"  # type: ignore[operator]
    assert list((run / "checkpoints").glob("checkpoint-*")), "stop saved no checkpoint"
    assert not (run / "final").exists()
    expect(page.locator("#run-log")).to_contain_text("to continue, run the same command again", timeout=10_000)
