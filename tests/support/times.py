"""Rows written with times of their own (synthetic history: tests and bench/scale.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def own_times(*models: Any) -> Iterator[None]:
    """bulk_create stamps auto_now_add `created_at` with now; history needs its own."""
    fields = [model._meta.get_field("created_at") for model in models]
    for field in fields:
        field.auto_now_add = False
    try:
        yield
    finally:
        for field in fields:
            field.auto_now_add = True
