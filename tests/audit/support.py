"""Helpers for the audit tests: calls through the API, the chain linked and walked."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from apps.audit import chain, digests, verify
from apps.audit.models import GENESIS, AuditEntry, AuditHead, link_v2
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.models import Tenant
from tests.approvals.support import ECHO
from tests.conftest import Agent
from tests.retention.support import age


def calls(agent: Agent, run_id: str, n: int = 1) -> list[str]:
    """n finished calls of the echo tool in the run; their invocation ids."""
    ids = []
    for i in range(n):
        response = agent.invoke(ECHO, runId=run_id, args={"text": f"{run_id}-{i}"})
        assert response.status_code == 200, response.content
        ids.append(response.json()["invocationId"])
    return ids


def verify_audit(*args: str) -> tuple[int, str]:
    """`manage.py verify_audit` after the sweeper's linking: (exit code, output)."""
    chain.link_pending()
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


@contextmanager
def triggers_off() -> Iterator[None]:
    """The audit triggers dropped (SQLite) or disabled (PostgreSQL) inside the block, as
    a database owner could; back after it."""
    if connection.vendor == "sqlite":
        off, on = digests.SQLITE_DROP, digests.sqlite_triggers()
    else:  # a superuser's session fires no ordinary trigger
        off, on = (
            ["SET session_replication_role = replica"],
            ["SET session_replication_role = DEFAULT"],
        )
    with connection.cursor() as cursor:
        for statement in off:
            cursor.execute(statement)
        try:
            yield
        finally:
            for statement in on:
                cursor.execute(statement)


def written_days_ago(tenant: Tenant, record_ids: list[str], days: int) -> None:
    """These calls as if made `days` ago: their rows aged (retention's tests' `age`) with
    the triggers off, their entries given the aged rows' digests and times, and the
    tenant's chain linked again from its start (as if written then)."""
    with triggers_off():
        age(record_ids, days)
    records = InvocationRecord.objects.filter(pk__in=record_ids)
    runs = set(records.values_list("run_id", flat=True))
    entries = list(AuditEntry.objects.filter(tenant=tenant, run_id__in=runs))
    current = verify._current(tenant, entries)
    times = {str(pk): at for pk, at in records.values_list("pk", "created_at")}
    times.update(
        (str(pk), at)
        for pk, at in RunEvent.objects.filter(tenant=tenant, run_id__in=runs).values_list(
            "pk", "at"
        )
    )
    for entry in entries:
        key = verify._key(entry)
        entry.digest, entry.at = current[key], times[key[1]]
        entry.save(update_fields=["digest", "at"])
    relink(tenant)


def relink(tenant: Tenant) -> None:
    """Every link of the tenant's chain computed again from its start, and its head."""
    link = GENESIS
    for entry in AuditEntry.objects.filter(tenant=tenant).order_by("n"):
        link = link_v2(link, entry.n, entry.kind, entry.row_id, entry.op, entry.digest, entry.at)
        AuditEntry.objects.filter(pk=entry.pk).update(link=link)
    AuditHead.objects.filter(tenant=tenant).update(link=link)
