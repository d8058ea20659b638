"""Keyset positions for the console's history: (created_at, id) of the last row shown.

A position is `<ISO timestamp>~<uuid>`; anything else is refused (None), so a forged
value never reaches the database as anything but a date and a UUID.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import Q

from apps.approvals.models import ApprovalRequest

SEPARATOR = "~"


def encode(approval: ApprovalRequest) -> str:
    return f"{approval.created_at.isoformat()}{SEPARATOR}{approval.pk}"


def decode(text: str) -> tuple[datetime, uuid.UUID] | None:
    if len(text) > 100 or text.count(SEPARATOR) != 1:
        return None
    at_text, id_text = text.split(SEPARATOR)
    try:
        at = datetime.fromisoformat(at_text)
        approval_id = uuid.UUID(id_text)
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    return at, approval_id


def older_than(at: datetime, approval_id: uuid.UUID) -> Q:
    """Rows after the position in the history's order (-created_at, -id)."""
    return Q(created_at__lt=at) | Q(created_at=at, id__lt=approval_id)
