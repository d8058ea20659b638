"""A call whose process died while it ran, holding its idempotency key: a record left
`running` and the ledger's entry naming it, as the runner's step 8 writes them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.invocations import ledger, runner
from apps.invocations.models import InvocationRecord, Status
from apps.tenants.models import Tenant
from apps.tools.models import Tool


def stuck_call(
    tenant: Tenant,
    principal: str,
    tool_id: str,
    args: dict[str, Any],
    key: str,
    *,
    lease_expires_at: datetime | None = None,
    tool_pending: bool | None = None,
    tool_call_id: str = "call-stuck",
) -> InvocationRecord:
    """`lease_expires_at` None: a call written before leases (apps/invocations/leases.py)
    existed, left to the sweeper's timeout rule."""
    tool = Tool.objects.get(pk=tool_id)
    record = InvocationRecord.objects.create(
        tenant=tenant,
        tool=tool,
        tool_ref=tool_id,
        tool_call_id=tool_call_id,
        run_id="run-stuck",
        principal=principal,
        idempotency_key=key,
        request_hash=runner.request_hash(tool_id, args, ""),
        status=Status.RUNNING,
        started_at=timezone.now(),
        lease_expires_at=lease_expires_at,
        tool_pending=tool_pending,
    )
    claimed = ledger.key_for(tool, principal, "run-stuck", key, args, "")
    assert claimed is not None
    ledger.claim(tenant, claimed, record, principal, "run-stuck", None)
    return record
