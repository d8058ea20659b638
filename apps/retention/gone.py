"""What a link to pruned data answers: 410 Gone, saying which pass removed it and when.

Records and approvals are found by their tombstone (PrunedId, one row per pruned id: a
primary-key lookup); a run's events by its PrunedRun (up to which seq they are gone).
Only a lookup that already missed asks here, so live traffic pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apps.retention.models import PrunedId, PrunedRun, PruneMark


def _mark(pk: Any, kind: str, tenant_ids: Iterable[int]) -> PruneMark | None:
    try:
        tombstone = (
            PrunedId.objects.select_related("mark")
            .filter(pk=pk, kind=kind, mark__tenant_id__in=list(tenant_ids))
            .first()
        )
    except (ValueError, TypeError):  # not a UUID: nothing was pruned under it
        return None
    return tombstone.mark if tombstone is not None else None


def record(pk: Any, tenant_id: int) -> dict[str, str] | None:
    """The 410 body for a pruned record of this tenant, else None (a plain 404)."""
    mark = _mark(pk, PrunedId.Kind.RECORD, [tenant_id])
    return mark.as_gone("records") if mark is not None else None


def approval(pk: Any, user: Any) -> dict[str, str] | None:
    """The 410 body for a pruned approval of a tenant this staff user operates, else None."""
    from apps.tenants.models import Tenant

    if not getattr(user, "is_staff", False):
        return None
    tenants = Tenant.objects.all()
    if not user.is_superuser:
        tenants = tenants.filter(members=user.pk)
    mark = _mark(pk, PrunedId.Kind.APPROVAL, tenants.values_list("pk", flat=True))
    return mark.as_gone("approvals") if mark is not None else None


def run_events(tenant_id: int, run_id: str, after: int) -> dict[str, Any] | None:
    """The `events_pruned` message for a replay from `after` whose next events were
    pruned (docs/asyncapi.yaml), sent before closing with 4410; None when every event
    after `after` is kept."""
    pruned = (
        PrunedRun.objects.select_related("mark")
        .filter(tenant_id=tenant_id, run_id=run_id, through_seq__gt=after)
        .first()
    )
    if pruned is None:
        return None
    gone = pruned.mark.as_gone("calls")
    return {
        "v": 1,
        "type": "events_pruned",
        "runId": run_id,
        "throughSeq": pruned.through_seq,
        "prunedAt": gone["prunedAt"],
        "prunedBefore": gone["prunedBefore"],
        "detail": f"Events through seq {pruned.through_seq} are gone: "
        f"{pruned.mark.describe('calls')} (retention).",
    }
