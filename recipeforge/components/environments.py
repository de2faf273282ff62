"""Tool environments of multi-turn GRPO, from the `environments` registry (group ``recipeforge.environments``).

An environment is a class whose instances run one episode each: ``reset(**row)`` starts an episode
from a dataset row (its return value, a string or None, is appended to the prompt), each public
method is a tool the model may call (typed arguments and a Google-style docstring: the chat template
shows the model their schema), and ``get_reward()`` (optional) scores the finished episode. This is
TRL's `environment_factory` contract (TRL 1.16, `GRPOTrainer`): TRL renders the tools into the prompt,
parses the model's tool calls with the chat template's response format, runs them, appends their
results as tool messages and lets the model continue, up to `grpo.environment.max_turns` tool turns;
tool-result tokens are masked out of the loss (`tool_mask`).

`grpo.environment.name` is a registered environment or ``module:Class`` Python code (which needs the
code opt-in, as rewards do); `grpo.environment.args` are the class's keyword arguments.

Built-in: ``calculator``, arithmetic on an AST whitelist (numbers, + - * / // % **, unary minus,
parentheses); nothing is evaluated by Python's ``eval``.
"""

from __future__ import annotations

import ast
import inspect
import operator
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from recipeforge.errors import Location, RecipeError
from recipeforge.registry import Registry, code_trust, import_code, is_code_reference


class EnvironmentRef(Protocol):
    """`grpo.environment` (or another RL section's): the environment's name and its arguments."""

    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Mapping[str, Any] | None: ...

environments: Registry[type] = Registry("environments")

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64       # 10**10**10 would hang the trainer: exponents stay small
MAX_MAGNITUDE = 10**18


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression, read through an AST whitelist (raises ValueError)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent above {MAX_EXPONENT}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return result  # type: ignore[no-any-return]
    raise ValueError(f"'{type(node).__name__}' is not allowed (numbers, + - * / // % ** and parentheses only)")


class CalculatorEnvironment:
    """Arithmetic with a calculator tool. The reward is 1 for an episode whose calculator calls all
    succeeded (at least one), plus `answer_weight` when a call's result equals the row's `answer`."""

    def __init__(self, answer_column: str = "answer", answer_weight: float = 1.0) -> None:
        self.answer_column = answer_column
        self.answer_weight = float(answer_weight)
        self.answer: str | None = None
        self.results: list[str] = []
        self.failures = 0

    def reset(self, **row: Any) -> None:
        """Start an episode for a dataset row (its `answer_column` is the expected value)."""
        answer = row.get(self.answer_column)
        self.answer = None if answer is None else str(answer).strip()
        self.results, self.failures = [], 0

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".

        Returns:
            The value of the expression.
        """
        try:
            value = evaluate_arithmetic(str(expression))
        except ValueError as exc:
            self.failures += 1
            return f"error: {exc}"
        text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        self.results.append(text)
        return text

    def get_reward(self) -> float:
        """1 when the calculator was called and every call succeeded, plus `answer_weight` for the answer."""
        if not self.results or self.failures:
            return 0.0
        right = self.answer is not None and self.answer in self.results
        return 1.0 + (self.answer_weight if right else 0.0)


environments.register("calculator", CalculatorEnvironment)


def get_environment_class(name: str, *, allow_code: bool, key: str = "grpo.environment.name",
                          location: Location | None = None) -> type:
    """The environment class `name` names: registered (built-in or plugin), or ``module:Class`` code when
    the user opted in (``allow_code: true`` or --trust-code)."""
    if is_code_reference(name):
        allowed, _ = code_trust(allow_code)
        search_dir = None
        if location is not None and location.file and not location.file.startswith("<"):
            search_dir = str(Path(location.file).resolve().parent)  # a module next to the recipe
        cls = import_code(name, allowed=allowed, what="environment", key=key, location=location,
                          search_dir=search_dir)
    else:
        cls = environments.get(name, key=key, location=location)
    if not inspect.isclass(cls) or not callable(getattr(cls, "reset", None)):
        raise RecipeError(f"environment '{name}' is not a class with a reset method", key=key, location=location,
                          hint="an environment class defines reset(**row), its tools as public methods, and "
                               "optionally get_reward()")
    return cls


def environment_factory(spec: EnvironmentRef, *, allow_code: bool, locate: Callable[[tuple], Location | None] = lambda p: None,
                        section: str = "grpo") -> Callable[[], Any]:
    """A factory of `spec`'s environment (`grpo.environment`) with its args checked against the class."""
    cls = get_environment_class(spec.name, allow_code=allow_code, key=f"{section}.environment.name",
                                location=locate((section, "environment", "name")))
    args = dict(spec.args or {})
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in args if k not in params and not takes_any]
    if unknown:
        raise RecipeError(f"environment '{spec.name}' takes no argument '{unknown[0]}'",
                          key=f"{section}.environment.args", location=locate((section, "environment", "args")),
                          hint=f"its arguments: {', '.join(p for p in params if p != 'self') or 'none'}")
    try:
        cls(**args)  # built once here: a bad value is a recipe error before the model loads
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"environment '{spec.name}' refuses its args: {exc}", key=f"{section}.environment.args",
                          location=locate((section, "environment", "args"))) from None
    return lambda: cls(**args)


def has_reward(factory: Callable[[], Any]) -> bool:
    """Whether the environment scores its episodes itself (`get_reward`)."""
    return callable(getattr(factory(), "get_reward", None))
