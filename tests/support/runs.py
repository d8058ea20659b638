"""A run's event numbers, as tests disturb them."""

from __future__ import annotations

from datetime import datetime

from apps.invocations.models import Run, RunEvent
from apps.tenants.models import Tenant


def take_next_number(tenant: Tenant, run_id: str, at: datetime) -> RunEvent:
    """Write an event row with the run's next number behind its counter's back, so the
    next statement that numbers an event of the run fails inside the database (a unique
    key). Returns the row (delete it to let the run go on)."""
    taken = Run.objects.get(tenant=tenant, run_id=run_id).last_seq + 1
    return RunEvent.objects.create(
        tenant=tenant,
        run_id=run_id,
        seq=taken,
        type="squatter",
        tool_call_id="x",
        tool_id="x",
        message={},
        at=at,
    )
