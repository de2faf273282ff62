"""Base recipes of recipeforge-example: ``extends: pkg://example/<file>.yaml`` (see pyproject.toml)."""
