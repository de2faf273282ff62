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
        text = _text(text)
        shown = self.shown_path(path)
        try:
            self.guard(path, text)
            hw = _hardware(hardware)
            extra = _overrides(overrides)
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
        text = _text(text)
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
        """The form of an edit: the fields of its stage (from the recipe's JSON Schema), the values it
        resolves to (`extends:`, defaults and ${...} applied, as `recipeforge resolve` writes them; when it
        does not validate, the merged values without defaults) and the dotted keys its own text sets."""
        from recipeforge.cli.ui_server.form import stage_form
        from recipeforge.config.load import load_yaml_text

        path = self.path_of(rel)
        text = _text(text)
        shown = self.shown_path(path)
        self.guard(path, text)
        own = load_yaml_text(text, shown).data
        ns = recipe_namespace("resolve", shown)
        ns.text = text
        resolved = as_data(records.resolve, ns)
        merged = self._merged(path, text, own)
        values, complete = (merged, False) if "error" in resolved else (resolved["resolved"], True)
        stage = values.get("stage")
        if not isinstance(stage, str) or stage not in _stage_names():
            raise RecipeError(f"the recipe's stage {stage!r} is not one the schema knows", key="stage",
                              hint="set stage: (sft, dpo, ...) in the YAML view")
        own_keys = _dotted_keys(own)
        return {"stage": stage, "sections": [f.record() for f in stage_form(stage)], "values": values,
                "set": sorted(own_keys), "inherited": sorted(_dotted_keys(merged) - own_keys), "resolved": complete}

    def _merged(self, path: Path, text: str, own: dict[str, object]) -> dict[str, object]:
        from recipeforge.config.compose import compose_file

        try:
            return dict(json.loads(json.dumps(compose_file(path, text).data, default=str)))
        except RecipeError:  # a parent that does not load: the file's own values
            return dict(json.loads(json.dumps(own, default=str)))

    def set_key(self, rel: object, text: object, key: object, value: object) -> Record:
        """The edit's text with one dotted `key` set to `value` (typed by the key's schema), changed only
        where it has to be (yaml_edit.py); a key the schema of the recipe's stage does not have is refused
        at the place in the text where it would go."""
        from recipeforge.cli.ui_server.form import field_index, parse_key, typed
        from recipeforge.cli.ui_server.yaml_edit import set_key
        from recipeforge.config.load import load_yaml_text

        path = self.path_of(rel)
        text = _text(text)
        shown = self.shown_path(path)
        self.guard(path, text)
        tree = load_yaml_text(text, shown)
        parts = parse_key(key)
        dotted = ".".join(parts)
        stage = self._merged(path, text, tree.data).get("stage")
        if parts == ("stage",):
            stage = value
        fields = field_index(stage) if isinstance(stage, str) and stage in _stage_names() else None
        if fields is None:
            raise RecipeError(f"the recipe's stage {stage!r} is not one the schema knows", key="stage",
                              location=tree.locate(("stage",)), hint="set stage: in the YAML view first")
        field = fields.get(dotted)
        if field is None:
            import difflib

            near = difflib.get_close_matches(dotted, list(fields), n=3)
            raise RecipeError(f"{dotted} is not a key of a {stage} recipe", key=dotted, location=tree.locate(parts),
                              hint=f"did you mean {', '.join(near)}?" if near else
                              "the keys are those `recipeforge schema` lists")
        if field.kind in ("group", "readonly"):
            raise RecipeError(f"{dotted} is {'a section' if field.kind == 'group' else field.note.split(':')[0]}, "
                              "not one value", key=dotted, location=tree.locate(parts), hint="edit it in the YAML view")
        data = typed(field, value)
        return {"text": set_key(text, parts, data, shown), "key": dotted, "value": data}

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
        extra = [*_overrides(overrides), f"output.dir={run_dir}"]
        return extra, train_argv(self.shown_path(path), extra, trust_code=self.trust_code)


def command_line(argv: list[str]) -> str:
    """An argv as one line to copy into a shell (quoted; the server itself never runs it in one)."""
    return shlex.join(argv)


def disk_chain(path: Path) -> list[Path]:
    """`path` and every recipe file its `extends:` chain names on disk (real paths). A parent that cannot
    be read or is not a recipe (another tool's config, a system file) is left out, so the page never shows
    it; validation reports it at its `extends` entry without quoting it."""
    from recipeforge.config.compose import MAX_DEPTH as CHAIN_DEPTH, locate_parent, recipe_top_level_keys
    from recipeforge.config.load import load_yaml_file
    from recipeforge.errors import Location

    seen: list[Path] = []
    todo = [path.resolve()]
    keys = recipe_top_level_keys()
    while todo and len(seen) < CHAIN_DEPTH:
        current = todo.pop(0)
        if current in seen:
            continue
        try:
            parents = load_yaml_file(current, recipe_keys=keys if seen else None).data.get("extends")
        except (RecipeError, OSError):
            continue
        seen.append(current)
        refs = [parents] if isinstance(parents, str) else parents if isinstance(parents, list) else []
        for ref in refs:
            if isinstance(ref, str):
                try:
                    todo.append(locate_parent(ref, current.parent, Location(str(current))).resolve())
                except (RecipeError, OSError):
                    continue
    return seen


def _dotted_keys(data: dict[str, object], prefix: str = "") -> set[str]:
    """Every dotted key a mapping sets (sections too); lists are values."""
    out: set[str] = set()
    for name, value in data.items():
        key = f"{prefix}{name}"
        out.add(key)
        if isinstance(value, dict):
            out |= _dotted_keys(value, key + ".")
    return out


def _stage_names() -> list[str]:
    from recipeforge.cli.ui_server.form import stages

    return stages()


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
    import json

    records.check_overrides(args.overrides)
    plan = checked_plan(args)
    return {"plan": json.loads(plan_json(plan, indent=None)), "text": render_plan(plan)}


def _read(path: Path) -> str:
    from recipeforge.config.load import MAX_BYTES

    if path.stat().st_size > MAX_BYTES:
        raise Refused(f"{path.name} is larger than a recipe may be ({MAX_BYTES} bytes)")
    return path.read_text(encoding="utf-8", errors="replace")


def _text(text: object) -> str:
    from recipeforge.config.load import MAX_BYTES

    if not isinstance(text, str):
        raise RecipeError("the recipe text is missing", key="text")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise RecipeError(f"the recipe is larger than {MAX_BYTES} bytes", key="text")
    return text


def _hardware(value: object) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > 100:
        raise RecipeError("--hardware must be text such as 8xH100-80GB", key="hardware")
    from recipeforge.plan.hardware import parse_hardware

    parse_hardware(value)  # a bad one is refused here, with the CLI's message
    return value


def _overrides(value: object) -> list[str]:
    if value in (None, ""):
        return []
    if isinstance(value, str):
        value = [line.strip() for line in value.splitlines() if line.strip()]
    if not isinstance(value, list) or len(value) > 200:
        raise RecipeError("overrides must be a list of key=value strings", key="overrides")
    records.check_overrides(value)
    return list(value)
