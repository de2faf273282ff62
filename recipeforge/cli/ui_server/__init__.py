"""`recipeforge ui`: a local web page over a folder of runs and the recipe files beside it (app.py: the
Starlette app; runs_view.py: runs, metrics, diff; editor.py: open, check, save, launch; access.py: the key,
the page token and the folders a request may read). Needs the `ui` extra (Starlette, uvicorn)."""
