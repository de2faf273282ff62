"""`recipeforge mcp`: an MCP server over stdio through which an agent drives recipeforge (a front end beside the
command line, in its layer: it reuses the commands' own functions).

`records` turns the CLI's own functions into the records the tools return (the same records the
commands print with ``--json``) and errors into data; `runs` starts, watches and stops training runs
as processes of their own; `server` declares the tools. Nothing here imports torch or transformers:
training runs in the `recipeforge train` process the `train` tool starts.
"""
