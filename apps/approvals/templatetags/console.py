"""Template filters for the console: JSON as JSON, and a one-line summary of a call's args.

Templates otherwise print Python reprs (`{'to': 'x', 'cc': None}`), which an operator
must then translate back into what the agent actually sent.
"""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()

SUMMARY_LIMIT = 120
VALUE_LIMIT = 40


@register.filter
def json_pretty(value: Any) -> str:
    """Indented JSON, as the API would carry it."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@register.filter
def json_compact(value: Any) -> str:
    """One-line JSON, for table cells."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


@register.filter
def args_summary(args: Any) -> str:
    """`to: "a@b.c", subject: "Hi"`: the top-level fields, each value cut short, so a queue
    row says what the call would do without opening it."""
    if not isinstance(args, dict):
        return _cut(json_compact(args), SUMMARY_LIMIT)
    if not args:
        return "no arguments"
    parts = [f"{key}: {_cut(json_compact(value), VALUE_LIMIT)}" for key, value in args.items()]
    return _cut(", ".join(parts), SUMMARY_LIMIT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
