"""recipeforge: declarative LLM training recipes on the Hugging Face stack."""

__version__ = "0.1.0"
