from __future__ import annotations

from django import template

from apps.receipts.inspection import Inspected, inspect

register = template.Library()


@register.filter
def inspected(receipt: str | None) -> Inspected | None:
    """`{% with checked=record.receipt|inspected %}`: None for a call with no receipt."""
    return inspect(receipt) if receipt else None
