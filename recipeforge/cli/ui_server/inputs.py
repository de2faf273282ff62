"""The editor's inputs from a request, checked as data before anything reads them: the recipe text, a
`--hardware` value and `key=value` overrides."""

from __future__ import annotations

from recipeforge.cli.mcp_server import records
from recipeforge.errors import RecipeError


def text_input(text: object) -> str:
    """The recipe text a request sends, refused when missing or larger than a recipe may be."""
    from recipeforge.config.load import MAX_BYTES

    if not isinstance(text, str):
        raise RecipeError("the recipe text is missing", key="text")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise RecipeError(f"the recipe is larger than {MAX_BYTES} bytes", key="text")
    return text


def hardware_input(value: object) -> str | None:
    """A `--hardware` value (None: the recipe's own), refused with the CLI's message when malformed."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > 100:
        raise RecipeError("--hardware must be text such as 8xH100-80GB", key="hardware")
    from recipeforge.plan.hardware import parse_hardware

    parse_hardware(value)  # a bad one is refused here, with the CLI's message
    return value


def overrides_input(value: object) -> list[str]:
    """`key=value` overrides, one per line or a list, checked as the MCP tools check them (no allow_code)."""
    if value in (None, ""):
        return []
    if isinstance(value, str):
        value = [line.strip() for line in value.splitlines() if line.strip()]
    if not isinstance(value, list) or len(value) > 200:
        raise RecipeError("overrides must be a list of key=value strings", key="overrides")
    records.check_overrides(value)
    return list(value)
