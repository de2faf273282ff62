"""Backends and stages are named once: the planner, the stage runners, the run and the CLI hold no
backend or stage name as a string literal. They ask the backend specs (`backends.base.BackendSpec`,
found through the registry) and compare with `capabilities.Stage`; a stage runner's module may name
its own stage, and a backend's module its own backend.

Read with `ast`: docstrings and comments may name them, code may not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import recipeforge
from recipeforge.capabilities import STAGES, BackendName
from recipeforge.stage_specs import Stage

PACKAGE = Path(recipeforge.__file__).resolve().parent
SCOPE = [*sorted((PACKAGE / "plan").glob("*.py")), *sorted((PACKAGE / "stages").glob("*.py")),
         *sorted((PACKAGE / "run").glob("*.py")), *sorted((PACKAGE / "cli").glob("*.py"))]
NAMES = {b.value for b in BackendName} | {s.value for s in Stage}
# Third-party vocabulary that happens to spell a stage: (module, literal, whose word it is).
ALLOWED = {
    ("stages/dpo.py", "sft"): "TRL's DPOConfig.loss_type name of the NLL term",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _own_names(path: Path) -> set[str]:
    """The name a module may write: its own (backends/fsdp.py), or its backend's in one of the parts
    it is split into (backends/fsdp_plan.py, fsdp_run.py)."""
    return {path.stem, path.stem.rsplit("_", 1)[0]}


def named_literals(path: Path) -> list[str]:
    """`file:line: 'name'` for each backend or stage name written as a string literal in `path`."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    rel = str(path.relative_to(PACKAGE))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
                and id(node) not in skip and node.value not in _own_names(path) and (rel, node.value) not in ALLOWED):
            found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_the_scan_sees_a_literal():
    planner = PACKAGE / "backends" / "deepspeed_plan.py"
    assert "NAME = \"deepspeed\"" in planner.read_text() and named_literals(planner) == []  # its own name only
    assert named_literals(PACKAGE / "backends" / "megatron_container.py")  # names Megatron-Bridge's "sft" dataset kind


def test_no_backend_or_stage_name_in_the_planner_stages_run_or_cli():
    assert len(SCOPE) > 40
    found = [line for path in SCOPE for line in named_literals(path)]
    assert not found, "ask the backend spec or use capabilities.Stage instead of:\n" + "\n".join(found)


def test_stages_are_listed_once_and_each_spec_is_whole():
    from recipeforge.components.formats import KIND_STAGES
    from recipeforge.config.schema import recipe, stage_recipes as schema
    from recipeforge.stage_specs import STAGE_SPECS
    from recipeforge.stages import RUNNERS

    assert recipe.STAGES is STAGES and tuple(RUNNERS) == STAGES == tuple(STAGE_SPECS)
    assert set(schema.STAGE_CLASSES) == set(STAGES)
    for name, spec in STAGE_SPECS.items():
        cls = schema.STAGE_CLASSES[name]
        assert cls.__doc__ == spec.summary and cls.model_json_schema()["description"] == spec.summary
        if spec.section:  # the section only this stage has is a field of its recipe class alone
            assert spec.section in cls.model_fields and schema.STAGE_ONLY_SECTIONS[spec.section] == name
            assert not any(spec.section in other.model_fields for other in schema.STAGE_CLASSES.values()
                           if other is not cls)
        module, _, runner = spec.runner.partition(":")  # read, not imported (TRL imports take seconds)
        source = (PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text()
        assert f"class {runner}(" in source and f'stage = "{name}"' in source, spec.runner
        assert all(name in KIND_STAGES[kind] for kind in spec.format_kinds)
