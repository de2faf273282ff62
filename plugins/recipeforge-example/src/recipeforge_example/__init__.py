"""recipeforge-example: a worked example of a recipeforge plugin.

It adds one component to four registries, each through an entry point in pyproject.toml:

* reward ``word_overlap`` (`rewards.word_overlap`), with its own argument schema;
* dataset format ``qa`` (`formats.QA`): question/answer rows as GRPO prompts;
* model ``example/tiny-wide`` (`models.TINY_WIDE`): an architecture the planner sizes, and a loader
  that builds it (random init, offline);
* base recipe ``pkg://example/grpo-qa.yaml`` (the `recipes` package directory).

Importing this package imports no torch: recipeforge loads plugins while it validates recipes, and
that must stay fast. Heavy imports go inside the functions that train.
"""

__version__ = "0.1.0"
