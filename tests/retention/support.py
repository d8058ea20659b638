"""Helpers for the retention tests: calls made through the API, then aged in the database."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

from django.core.management import call_command
from django.utils import timezone

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord, RunEvent
from apps.retention.models import RetentionPolicy
from apps.tenants.models import Tenant
from tests.conftest import Agent

CLOCK = "core__get_current_time"


def call(agent: Agent, run_id: str, n: int = 1, tool: str = CLOCK, **body: Any) -> list[str]:
    """n finished calls in the run, one after another; their invocation ids."""
    ids = []
    for _ in range(n):
        response = agent.invoke(tool, runId=run_id, **body)
        assert response.status_code in (200, 202), response.content
        ids.append(response.json()["invocationId"])
    return ids


def age(record_ids: list[str], days: int) -> None:
    """Move these calls (records, their events, their approvals) `days` into the past,
    a millisecond apart in the order they were made."""
    then = timezone.now() - timedelta(days=days)
    records = InvocationRecord.objects.filter(pk__in=record_ids).order_by("created_at")
    rows = list(records.values_list("pk", "tenant_id", "run_id", "tool_call_id"))
    for i, (pk, tenant_id, run_id, call_id) in enumerate(rows):
        at = then + timedelta(milliseconds=i)
        RunEvent.objects.filter(tenant_id=tenant_id, run_id=run_id, tool_call_id=call_id).update(
            at=at
        )
        ApprovalRequest.objects.filter(invocation_id=pk).update(created_at=at)
        InvocationRecord.objects.filter(pk=pk).update(created_at=at)


def keep_for(tenant: Tenant, days: int | None) -> None:
    RetentionPolicy.objects.update_or_create(tenant=tenant, defaults={"days": days})


def prune(*args: str) -> str:
    """`manage.py prune` with these arguments; what it printed."""
    out = io.StringIO()
    call_command("prune", *args, stdout=out, stderr=out)
    return out.getvalue()


def seqs(tenant: Tenant, run_id: str) -> list[int]:
    return list(
        RunEvent.objects.filter(tenant=tenant, run_id=run_id)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
