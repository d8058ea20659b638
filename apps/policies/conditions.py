"""CEL conditions for policy rules.

We use `common-expression-language` (a Rust CEL implementation with Python
bindings): it follows the CEL spec, compiles an expression once into a reusable
program, and evaluates in microseconds, so rules cost little on the hot path.
cel-python was the alternative; it is pure Python and markedly slower.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import cel


class ConditionError(Exception):
    """An expression that does not compile, or that failed or returned a non-boolean."""


@lru_cache(maxsize=1024)
def compile_condition(expression: str) -> Any:
    if not expression.strip():
        raise ConditionError("The condition is empty.")
    if len(expression) > 2000:
        raise ConditionError("The condition is longer than 2000 characters.")
    try:
        return cel.compile(expression)
    except (ValueError, RuntimeError, TypeError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConditionError(f"The condition does not compile: {first_line}") from None


def holds(expression: str, variables: dict[str, Any]) -> bool:
    program = compile_condition(expression)
    try:
        value = program.execute(variables)
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
