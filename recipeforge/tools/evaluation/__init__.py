"""`recipeforge eval`: benchmarks of a finished run with EleutherAI's lm-evaluation-harness.

`tasks` turns task names and local task files into what lm-eval loads, `runner` runs the harness on
final/ and writes RUN_DIR/eval/<task>.json, `results` reads them back (model card, report, comparison),
`command` maps the command line and the recipe's `eval:` section onto them. Only `runner` imports
lm-eval and torch.
"""
