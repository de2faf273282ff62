"""`recipeforge report` on real runs of the tiny recipes: two SFT runs that differ in learning rate and a
GRPO run, the loss plot `train` leaves in a run, and the page opened in a headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the report needs the `report` extra (matplotlib)")

pytestmark = pytest.mark.slow

SFT = ("train.max_steps=8", "train.logging_steps=2", "data.val_size=8", "train.eval_steps=4")
LEARNING_RATES = ("1e-2", "2e-3")


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Two short SFT runs (learning rates 1e-2 and 2e-3) and a short GRPO run, trained in this process."""
    base = tmp_path_factory.mktemp("report-runs")
    sft = [tiny.train("sft-lora", base / f"sft-lr{lr}", *SFT, f"train.learning_rate={lr}", "output.merge_adapter=false")
           for lr in LEARNING_RATES]
    grpo = tiny.train("grpo", base / "grpo", "train.max_steps=4", "train.logging_steps=1")
    return [*sft, grpo]


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory):
    from recipeforge.cli import main

    out = tmp_path_factory.mktemp("report") / "cmp.html"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    return out


def _jsonl(run: Path, key: str, split: str) -> tuple[list[int], list[float]]:
    """Steps and values as metrics.jsonl holds them, parsed here independently of the report code."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    pairs = [(r["step"], r[key]) for r in rows if r.get("split") == split and isinstance(r.get(key), (int, float))]
    return [s for s, _ in pairs], [float(v) for _, v in pairs]


def test_the_runs_learned(runs):
    for run in runs[:2]:
        _, loss = _jsonl(run, "loss", "train")
        assert loss[-1] < loss[0] - 0.5, loss  # each SFT run's loss fell: there is a curve worth plotting


def test_page_names_every_run_embeds_every_image_and_needs_nothing_else(runs, page):
    import matplotlib.image

    text = page.read_text()
    for run in runs:
        assert f"<td>{run.name}</td>" in text
    pngs = sorted(page.parent.glob("cmp-*.png"))
    names = {p.stem.removeprefix("cmp-") for p in pngs}
    # SFT: loss (train and eval), learning rate, grad norm, padding; GRPO: its two rewards, total, lengths.
    assert {"loss", "learning_rate", "grad_norm", "padding_share", "reward", "reward_length",
            "reward_exact_match", "completion_length", "tokens_per_second"} <= names, names
    assert "reward_margins" not in names  # no DPO run: no chart for metrics no run holds
    for png in pngs:
        pixels = matplotlib.image.imread(png)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert f"data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}" in text
    assert text.count("<img ") == len(pngs)
    # Self-contained: no file, script, stylesheet or font is fetched from anywhere.
    assert not re.search(r"""(src|href)=["'](?!data:)""", text)
    assert "<script" not in text and "<link" not in text and "@import" not in text


def test_difference_table_shows_the_learning_rates(runs, page):
    text = page.read_text()
    row = re.search(r"<tr><td><code>train\.learning_rate</code></td>(.*?)</tr>", text)
    assert row, "no train.learning_rate row in the recipe differences"
    assert re.findall(r"<td>(.*?)</td>", row.group(1)) == ["0.01", "0.002", "0.01"]
    assert "<code>stage</code>" in text  # sft, sft, grpo
    assert "output.dir" not in text.split("Recipe differences")[1]  # where a run lives is not a difference


def test_plotted_curves_are_the_runs_metrics(runs):
    from recipeforge.tools.report_plots import charts_for, draw, figure_lines
    from recipeforge.tools.report_runs import read_runs

    read = read_runs(runs)
    labels = [r.label for r in read]
    charts = {chart.name: (chart, lines) for chart, lines in charts_for(read)}
    expected = {"loss": [(run, "loss", "train") for run in runs[:2]] + [(run, "eval_loss", "eval") for run in runs[:2]]
                + [(runs[2], "loss", "train")],
                "learning_rate": [(run, "learning_rate", "train") for run in runs],
                "reward_length": [(runs[2], "rewards/length/mean", "train")],
                "completion_length": [(runs[2], "completions/mean_length", "train")]}
    for name, wanted in expected.items():
        chart, lines = charts[name]
        drawn = figure_lines(draw(chart, lines, labels))
        assert len(drawn) == len(wanted), (name, [d[0] for d in drawn])
        for label, xs, ys in drawn:
            run = next(r for r in runs if label.startswith(r.name))
            key, split = next((k, s) for r, k, s in wanted if r == run and (s == "eval") == label.endswith("(eval)"))
            steps, values = _jsonl(run, key, split)
            assert xs == steps and ys == pytest.approx(values), (name, label)
    lr = [ys for label, _, ys in figure_lines(draw(*charts["learning_rate"], labels))]
    assert max(lr[0]) > 4 * max(lr[1])  # the two SFT runs really are apart on the learning-rate chart


def test_train_writes_loss_png_and_the_model_card_shows_it(runs):
    import matplotlib.image

    for run in runs:
        png = run / "loss.png"
        assert matplotlib.image.imread(png).shape[0] > 100
        card = (run / "README.md").read_text()
        link = re.search(r"!\[Training loss\]\(([^)]+)\)", card)
        assert link and (run / link.group(1)).resolve() == png.resolve()


def test_a_run_still_training_is_reported(runs, tmp_path):
    from recipeforge.cli import main

    live = tmp_path / "live"
    shutil.copytree(runs[0], live, ignore=shutil.ignore_patterns("final", "merged", "checkpoints", "*.png"))
    lines = (live / "metrics.jsonl").read_text().splitlines()
    train_rows = [i for i, line in enumerate(lines) if json.loads(line)["split"] == "train"]
    kept = lines[: train_rows[2] + 1]  # three training rows so far, then a row cut off mid-write
    (live / "metrics.jsonl").write_text("\n".join(kept) + "\n" + lines[train_rows[3]][:25])
    out = tmp_path / "live.html"
    assert main(["report", str(live), "--out", str(out)]) == 0
    text = out.read_text()
    assert "live has no final/ model" in text and "was being written and is left out" in text
    from recipeforge.tools.report_runs import read_run

    steps, _ = read_run(live).series("loss", "train")
    assert steps == [json.loads(lines[i])["step"] for i in train_rows[:3]]


BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "chrome-headless-shell", "google-chrome",
            "google-chrome-stable", "chrome")
CHECK = """<script>
window.addEventListener("load", function () {
  var out = Array.prototype.map.call(document.images, function (img) {
    return {alt: img.alt, width: img.naturalWidth, complete: img.complete};
  });
  var pre = document.createElement("pre");
  pre.id = "image-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
# A control image that cannot decode: the check must see it fail, or it would prove nothing.
BROKEN = '<img src="data:image/png;base64,iVBORw0KGgoAAAAA" alt="broken control">'


def _browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def test_every_image_loads_in_a_headless_browser(request, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip(f"no Chromium binary found on PATH (looked for {', '.join(BROWSERS)}); install one, e.g. "
                    f"apt-get install chromium-headless-shell, to open the report in a browser")
    page = request.getfixturevalue("page")  # trained and written only when a browser can open it
    copy = tmp_path / "page.html"
    copy.write_text(page.read_text().replace("</body>", f"{BROKEN}\n{CHECK}\n</body>"))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-proxy-server",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom", copy.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="image-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the browser printed no image check (exit {proc.returncode}): {proc.stderr[-2000:]}"
    import html

    images = json.loads(html.unescape(found.group(1)))
    charts = [i for i in images if i["alt"] != "broken control"]
    assert len(charts) == page.read_text().count("<img ") >= 9
    assert all(i["complete"] and i["width"] > 0 for i in charts), charts
    assert [i["width"] for i in images if i["alt"] == "broken control"] == [0]
