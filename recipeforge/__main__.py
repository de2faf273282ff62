"""`python -m recipeforge` (and `accelerate launch -m recipeforge ...`) entry point."""

from recipeforge.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
