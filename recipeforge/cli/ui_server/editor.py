"""The recipe editor's data: the recipes under the recipes folder, one recipe with its `extends:` chain, each
edit checked (validated and planned) with the CLI's own located errors, saving an edit, and the command a
launch runs.

An edit is checked as the text the page holds, read as if it were the file (its errors name the file and
its line), by the functions `recipeforge validate --json` and `plan --json` use. Two things an edit may not
do that the file on disk does not already do, since they would widen what the page can read or run:
name a parent (`extends:`) outside the recipes folder and the file's own chain, or turn on `allow_code`
(unless the server was started with ``recipeforge --trust-code ui``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import tempfile
from pathlib import Path

from recipeforge.cli.mcp_server import records
from recipeforge.cli.error_data import error_record
from recipeforge.cli.mcp_server.records import Record, as_data, recipe_namespace
from recipeforge.cli.mcp_server.runs import is_run_dir
from recipeforge.cli.ui_server.access import NotFound, Refused, confined, inside
from recipeforge.cli.ui_server.inputs import hardware_input, overrides_input, text_input
from recipeforge.cli.ui_server.recipe_chain import disk_chain
from recipeforge.errors import RecipeError

SUFFIXES = (".yaml", ".yml")
MAX_RECIPES = 1000
MAX_DEPTH = 5
SKIPPED = {"node_modules", "__pycache__", "site-packages"}
LOCATION = re.compile(r"^(.*?):(\d+)(?::(\d+))?$")  # file:line[:col], as `Location.render` writes it


class Editor:
    """The recipes under `root` (a folder); `shown` is how the user named it (errors name files by it)."""

    def __init__(self, root: Path, *, trust_code: bool):
        self.shown = root
        self.root = root.resolve()
        self.trust_code = trust_code

    def listing(self) -> list[str]:
        """The recipe files under the folder (relative paths, at most 1000, hidden folders left out)."""
        found: list[str] = []
        for folder, dirs, files in os.walk(self.root, followlinks=False):
            depth = len(Path(folder).relative_to(self.root).parts)
            # Run directories hold YAML records (resolved_recipe.yaml, recipe.lock.yaml), not recipes to edit.
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED and depth < MAX_DEPTH
                             and not is_run_dir(Path(folder, d)))
            for name in sorted(files):
                path = Path(folder, name)
                if name.endswith(SUFFIXES) and not name.startswith(".") and inside(self.root, path):
                    found.append(path.relative_to(self.root).as_posix())
                    if len(found) >= MAX_RECIPES:
                        return found
        return found

    def path_of(self, rel: object) -> Path:
        """The recipe file `rel` names under the folder (`Refused` outside it, `NotFound` when missing)."""
        path = confined(self.root, rel, what="recipe")
        if path.suffix not in SUFFIXES:
            raise Refused(f"{rel} is not a recipe file (.yaml)", key="recipe", hint="open a .yaml recipe")
        if not path.is_file():
            raise NotFound(f"{rel}: no such recipe under {self.shown}", key="recipe")
        return path

    def shown_path(self, path: Path) -> str:
        """A file as errors name it: under the folder as the user named the folder, else its full path."""
        return str(self.shown / path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)

    def open(self, rel: object) -> Record:
        """A recipe's text and the files of its `extends:` chain (editable when under the folder)."""
        path = self.path_of(rel)
        chain = []
        for parent in disk_chain(path)[1:]:
            shown = parent.relative_to(self.root).as_posix() if inside(self.root, parent) else str(parent)
            chain.append({"file": shown, "editable": inside(self.root, parent), "text": _read(parent)})
        return {"recipe": path.relative_to(self.root).as_posix(), "file": self.shown_path(path),
                "text": _read(path), "chain": chain}

    def check(self, rel: object, text: object, hardware: object, overrides: object) -> Record:
        """An edit checked: the `validate --json` record (or its located errors) and, when valid, the plan
        for `hardware` (`plan --json` and the text `plan` prints)."""
        path = self.path_of(rel)
        text = text_input(text)
        shown = self.shown_path(path)
        try:
            self.guard(path, text)
            hw = hardware_input(hardware)
            extra = overrides_input(overrides)
        except RecipeError as exc:
            return {"validate": _with_lines(error_record(exc), path), "plan": None}
        ns = recipe_namespace("validate", shown, extra)
        ns.text = text
        valid = as_data(records.validate, ns)
        if "error" in valid:
            return {"validate": _with_lines(valid, path), "plan": None}
        ns = recipe_namespace("plan", shown, extra, hw)
        ns.text = text
        return {"validate": valid, "plan": as_data(_plan, ns)}

    def save(self, rel: object, text: object) -> Record:
        """Write an edit to its file (atomically), after the same guard as a check."""
        path = self.path_of(rel)
        text = text_input(text)
        self.guard(path, text)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:  # a read-only folder, a full disk: the user's to fix
            raise RecipeError(f"cannot save {self.shown_path(path)}: {exc.strerror}", key="recipe") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
            os.chmod(tmp, path.stat().st_mode & 0o777)
            os.replace(tmp, path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise RecipeError(f"cannot save {self.shown_path(path)}: {exc.strerror}", key="recipe") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return {"recipe": path.relative_to(self.root).as_posix(), "saved": True, "bytes": len(text.encode())}

    def form(self, rel: object, text: object) -> Record:
        """The form of an edit (form_edit.form_of): its stage's fields, the values it resolves to and the
        keys its own text sets."""
        from recipeforge.cli.ui_server.form_edit import form_of

        path = self.path_of(rel)
        text = text_input(text)
        self.guard(path, text)
        return form_of(path, self.shown_path(path), text)

    def set_key(self, rel: object, text: object, key: object, value: object) -> Record:
        """The edit's text with one dotted `key` set to `value` (form_edit.key_set)."""
        from recipeforge.cli.ui_server.form_edit import key_set

        path = self.path_of(rel)
        text = text_input(text)
        self.guard(path, text)
        return key_set(path, self.shown_path(path), text, key, value)

    def guard(self, path: Path, text: str) -> None:
        """Refuse an edit that names a parent outside the folder and the file's own chain, or turns on
        `allow_code` where the file does not (without --trust-code); errors located in the edit."""
        from recipeforge.config.compose import PKG_SCHEME
        from recipeforge.config.load import load_yaml_file, load_yaml_text

        shown = self.shown_path(path)
        try:
            tree = load_yaml_text(text, shown)
        except RecipeError:
            return  # a syntax error: validation reports it at its line; nothing is read or run
        if tree.data.get("allow_code") is True and not self.trust_code:
            try:
                on_disk = load_yaml_file(path).data.get("allow_code") is True
            except RecipeError:
                on_disk = False
            if not on_disk:
                raise RecipeError("allow_code: true is not turned on from this page", location=tree.locate(("allow_code",)),
                                  key="allow_code", hint="running code a recipe names is your decision: add "
                                  "allow_code: true to the file in your own editor, or start the page with "
                                  "recipeforge --trust-code ui")
        parents = tree.data.get("extends")
        entries = [parents] if isinstance(parents, str) else parents if isinstance(parents, list) else []
        allowed = set(disk_chain(path))
        for i, ref in enumerate(entries):
            if not isinstance(ref, str) or ref.startswith(PKG_SCHEME):
                continue  # a plugin's recipe, or a bad entry validation reports
            target = (path.parent / ref).resolve()
            if not inside(self.root, target) and target not in allowed:
                where = ("extends", i) if isinstance(parents, list) else ("extends",)
                raise RecipeError(f"extends {ref!r} names a file outside {self.shown}", location=tree.locate(where),
                                  key="extends", hint="a recipe edited here may extend recipes under the recipes "
                                                      "folder, or those its file already extends")

    def command(self, rel: object, run_dir: Path, overrides: object) -> tuple[list[str], list[str]]:
        """The overrides a launch of recipe `rel` into `run_dir` passes, and the argv it runs."""
        from recipeforge.cli.mcp_server.runs import train_argv

        path = self.path_of(rel)
        extra = [*overrides_input(overrides), f"output.dir={run_dir}"]
        return extra, train_argv(self.shown_path(path), extra, trust_code=self.trust_code)


def command_line(argv: list[str]) -> str:
    """An argv as one line to copy into a shell (quoted; the server itself never runs it in one)."""
    return shlex.join(argv)


def _with_lines(record: Record, path: Path) -> Record:
    """An error record whose problems in the edited file also carry their `line` and `column` (the page
    marks that line); problems in a parent file keep only their location."""
    error = record["error"]
    for problem in [error, *error.get("problems", ())]:
        match = LOCATION.match(problem.get("location") or "")
        if match and Path(match[1]).resolve() == path:
            problem["line"] = int(match[2])
            problem["column"] = int(match[3]) if match[3] else None
    return record


def _plan(args: argparse.Namespace) -> Record:
    from recipeforge.cli.planning import checked_plan, plan_json
    from recipeforge.plan import render_plan

    records.check_overrides(args.overrides)
    plan = checked_plan(args)
    return {"plan": json.loads(plan_json(plan, indent=None)), "text": render_plan(plan)}


def _read(path: Path) -> str:
    from recipeforge.config.load import MAX_BYTES

    if path.stat().st_size > MAX_BYTES:
        raise Refused(f"{path.name} is larger than a recipe may be ({MAX_BYTES} bytes)")
    return path.read_text(encoding="utf-8", errors="replace")
