"""Shared test helpers (importable from any test: tests/ is on pytest's pythonpath)."""

MINIMAL = """\
stage: sft
model:
  name_or_path: tiny:llama
data:
  datasets:
    - {path: data.jsonl, format: alpaca}
"""
