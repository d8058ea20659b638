"""The console's view of a call's place in its tenant's audit chain."""

from typing import Any

from django import template

from apps.audit.verify import RecordStatus, record_status

register = template.Library()


@register.filter
def chain_status(record: Any) -> RecordStatus | None:
    """`{% with chain=record|chain_status %}`: whether the chain verifies up to this call
    (incremental: from the last verified position, apps.audit.verify.record_status)."""
    return record_status(record) if record is not None and record.pk else None
