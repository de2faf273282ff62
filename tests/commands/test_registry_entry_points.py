"""The registries with real entry points, in fresh interpreters: validating with plugins installed imports
no training stack, and a registry asked for before its module is imported is that module's (the rest:
tests/unit/plugins/test_registry_entry_points.py)."""

from __future__ import annotations

import sys

GRPO = """\
stage: grpo
model: {name_or_path: tiny:llama}
data:
  datasets: [{path: p.jsonl, format: prompt}]
train: {global_batch_size: 8}
grpo:
  num_generations: 4
"""


def test_validating_with_plugins_imports_no_training_stack(dists, tmp_path):
    """Registries list names and load the plugins a recipe names without torch or transformers."""
    import subprocess
    import textwrap

    dists.add("rf-light", {"recipeforge.rewards": {"light": "rf_light:factory"}}, {"rf_light.py": """
        from pydantic import BaseModel
        class Args(BaseModel):
            bonus: float = 1.0
        def factory(args, ctx):
            return lambda p, c, **kw: [args["bonus"]] * len(c)
        factory.args_model = Args
    """})
    (tmp_path / "r.yaml").write_text(GRPO + "  rewards: [{name: light, args: {bonus: 2}}]\n"
                                     "kernels: {torch_compile: {mode: default}}\n")
    script = textwrap.dedent(f"""
        import sys
        from recipeforge.config import load_recipe
        from recipeforge.config.validate import check_components
        from recipeforge.plugins import plugins_report
        check_components(load_recipe({str(tmp_path / 'r.yaml')!r}))
        plugins_report()
        assert "rf_light" in sys.modules
        print(sorted(m for m in ("torch", "transformers", "trl", "datasets", "peft") if m in sys.modules))
    """)
    env = {**__import__("os").environ, "PYTHONPATH": str(dists.root)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_registry_asked_for_before_its_module_is_imported_is_that_module_s(tmp_path):
    """`registry_for(kind)` in a fresh process, before anything imported the module owning the
    registry, returns that module's registry with its built-ins (never an empty stand-in)."""
    import subprocess
    import sys

    from recipeforge.registry import REGISTRY_KINDS

    code = ("from recipeforge.capabilities import capabilities_of\n"
            "from recipeforge.errors import RecipeError\n"
            "try:\n    capabilities_of('nope')\nexcept RecipeError:\n    pass\n"
            "from recipeforge.registry import REGISTRY_KINDS, registry_for\n"
            "import importlib\n"
            "for kind, k in REGISTRY_KINDS.items():\n"
            "    reg = registry_for(kind)\n"
            "    owner = [v for v in vars(importlib.import_module(k.module)).values() if v is reg]\n"
            "    print(kind, len(reg.names()), bool(owner))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    rows = {line.split()[0]: line.split()[1:] for line in out if line}
    assert set(rows) == set(REGISTRY_KINDS)
    for kind in ("backends", "kernels", "rewards", "formats", "rollout_engines"):
        assert int(rows[kind][0]) > 0, (kind, rows[kind])  # the built-ins are there
    assert all(owned == "True" for _, owned in rows.values()), rows  # the owning module's own object
