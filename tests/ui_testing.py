"""`recipeforge ui` in this process: a runs folder (run directories written by the run directory's own writers,
with a resolved recipe of a real tiny recipe) and a recipes folder (a copy of the tiny recipes), and
Starlette's TestClient on the app, with the page's token (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from report_testing import make_run

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "yaml" / "tiny"
HOST = "http://127.0.0.1:8765"


def make_site(tmp: Path, *, overrides: tuple[str, ...] = ()) -> dict[str, Path]:
    """runs/{done,other} (done finished; other with `overrides` in its recipe) and recipes/tiny/*.yaml."""
    from recipeforge.config import load_recipe
    from recipeforge.config.dump import resolved_data
    from recipeforge.outputs.run_dir import RunDir

    runs, recipes = tmp / "runs", tmp / "recipes"
    (recipes / "tiny").mkdir(parents=True)
    for name in ("base.yaml", "sft-lora.yaml", "pretrain.yaml"):
        shutil.copy(TINY / name, recipes / "tiny" / name)
    (tmp / "data").mkdir()
    for name in ("sft-chat.jsonl", "pretrain.jsonl"):
        if (REPO / "examples" / "data" / name).is_file():
            shutil.copy(REPO / "examples" / "data" / name, tmp / "data" / name)
    for name, extra in (("done", ()), ("other", overrides)):
        root = make_run(runs / name, finished=name == "done", recipe=False)
        loaded = load_recipe(TINY / "sft-lora.yaml", [f"output.dir={root}", *extra])
        RunDir(root).write_recipe(resolved_data(loaded))
    return {"runs": runs, "recipes": recipes, "tmp": tmp}


def client(site: dict[str, Path], *, key: str | None = None, local_only: bool = True, trust_code: bool = False) -> Any:
    """A TestClient on the app over `site`, its token header set (`.token`), `.app_config` kept."""
    from starlette.testclient import TestClient

    from recipeforge.cli.ui_server.app import UiConfig, build_app

    config = UiConfig(runs_dir=site["runs"], recipes_dir=site["recipes"], key=key, local_only=local_only,
                      trust_code=trust_code)
    c = TestClient(build_app(config), base_url=HOST)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    page = c.get("/", headers=headers)
    assert page.status_code == 200, page.text
    c.token = re.search(r'name="recipeforge-token" content="([^"]+)"', page.text).group(1)
    c.headers.update({"X-RecipeForge-Token": c.token, **headers})
    return c
