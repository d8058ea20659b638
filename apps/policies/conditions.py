"""CEL conditions for policy rules.

We use `common-expression-language` (a Rust CEL implementation with Python
bindings): it follows the CEL spec, compiles an expression once into a reusable
program, and evaluates in microseconds, so rules cost little on the hot path.
cel-python was the alternative; it is pure Python and markedly slower.

It holds Python's interpreter lock for a whole evaluation, and has no cost limit of
its own: every condition's cost is bounded when it is saved and checked at every
call (apps/policies/cost.py), so no rule can stop the server for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cel

from apps.policies import cost

MAX_LENGTH = 2000


class ConditionError(Exception):
    """An expression that does not compile, costs too much, failed, or returned a non-boolean."""


@dataclass(frozen=True)
class Condition:
    program: Any
    cost: cost.Cost


def compile_condition(expression: str) -> Condition:
    """The compiled condition, or ConditionError saying why it cannot be used. Run when a
    rule is saved and at every evaluation, so a rule saved before its cost was bounded, or
    under other limits, fails closed (the call is denied) rather than stalling."""
    compiled = _compiled(expression)
    if isinstance(compiled, str):
        raise ConditionError(compiled)
    return compiled


@lru_cache(maxsize=1024)
def _compiled(expression: str) -> Condition | str:
    """Cached with its refusal too: a refused rule in the database costs a lookup per call."""
    if not expression.strip():
        return "The condition is empty."
    if len(expression) > MAX_LENGTH:
        return f"The condition is longer than {MAX_LENGTH} characters."
    try:
        program = cel.compile(expression)
    except (ValueError, RuntimeError, TypeError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"The condition does not compile: {first_line}"
    try:
        bounded = cost.analyse(expression)
    except cost.TooExpensive as exc:
        return f"The condition is too expensive: {exc}."
    except cost.Unreadable as exc:
        return f"The condition's cost cannot be checked: {exc}."
    return Condition(program, bounded)


class CallBudget:
    """The steps the rules evaluated for one call may take together (cost.CALL_LIMIT):
    each rule is bounded when saved, and this bounds how many of them a call pays for."""

    def __init__(self, limit: float = cost.CALL_LIMIT) -> None:
        self.left = limit

    def spend(self, steps: float) -> None:
        if steps > self.left:
            raise ConditionError(
                "the rules that apply to this call would together take more than "
                f"{cost.steps(cost.CALL_LIMIT)} steps (about {cost.ms(cost.CALL_LIMIT)}) to "
                "evaluate; a tenant admin must make them fewer or cheaper"
            )
        self.left -= steps


def holds(expression: str, variables: dict[str, Any], budget: CallBudget | None = None) -> bool:
    condition = compile_condition(expression)
    chosen = condition.cost.variables(variables)
    try:
        steps = condition.cost.check(chosen)
    except cost.TooExpensive as exc:
        raise ConditionError(f"The condition is too expensive for this call: {exc}.") from None
    if budget is not None:
        budget.spend(steps)
    program = condition.program
    try:
        value = program.execute(chosen)
    except KeyError as exc:
        # CEL has no "absent is false": reading a field the call lacks is an error.
        name = str(exc.args[0]) if exc.args else "?"
        raise ConditionError(
            f"the call has no field {name!r}; a condition on an optional field must "
            f"test it first, e.g. has(args.{name}) && ..."
        ) from None
    except Exception as exc:
        # A missing field, a type mismatch, an undefined function: fail closed.
        raise ConditionError(f"The condition failed to evaluate ({type(exc).__name__}).") from None
    if not isinstance(value, bool):
        raise ConditionError("The condition did not return true or false.")
    return value
