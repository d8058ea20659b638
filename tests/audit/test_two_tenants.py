"""Issue 48, 3: two tenants writing at once, with two linkers running, lose no link and
cross none: each tenant's chain holds every one of its rows and none of the other's.

Threads with connections of their own on PostgreSQL, where writers run concurrently
(SQLite serialises them anyway)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.audit import chain
from apps.audit.models import AuditEntry, AuditPending, Kind
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.models import Tenant
from tests.approvals.support import ECHO
from tests.audit.support import verify_audit
from tests.conftest import Agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg("postgresql")]

CALLS = 20


def in_thread(work: Callable[[], None], failures: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def writer(agent: Agent) -> Callable[[], None]:
    def write() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        for n in range(CALLS):
            response = client.post(
                "/api/v1/invocations/",
                {"toolId": ECHO, "runId": f"run-{agent.tenant.slug}", "args": {"text": str(n)}},
                format="json",
            )
            assert response.status_code == 200, response.content

    return write


def test_two_tenants_writing_at_once_keep_whole_chains_of_their_own(caller, other):
    failures: list[BaseException] = []
    writers = [in_thread(writer(agent), failures) for agent in (caller, other)]
    done = threading.Event()

    def link_until_done() -> None:
        while not done.is_set():
            chain.link_pending()

    linkers = [in_thread(link_until_done, failures) for _ in range(2)]
    for thread in writers:
        thread.join()
    done.set()
    for thread in linkers:
        thread.join()
    assert failures == []
    chain.link_pending()
    assert not AuditPending.objects.exists()

    for tenant in (caller.tenant, other.tenant):
        assert_chain_holds_its_rows(tenant)
    code, out = verify_audit()
    assert code == 0, out


def assert_chain_holds_its_rows(tenant: Tenant) -> None:
    entries = AuditEntry.objects.filter(tenant=tenant)
    assert sorted(entries.values_list("n", flat=True)) == list(range(1, entries.count() + 1))
    records = {
        str(pk)
        for pk in InvocationRecord.objects.filter(tenant=tenant).values_list("pk", flat=True)
    }
    events = {str(pk) for pk in RunEvent.objects.filter(tenant=tenant).values_list("pk", flat=True)}
    assert len(records) == CALLS and len(events) == 2 * CALLS
    chained_records = {
        str(r) for r in entries.filter(kind=Kind.RECORD).values_list("row_id", flat=True)
    }
    chained_events = set(entries.filter(kind=Kind.EVENT).values_list("row_id", flat=True))
    assert {r.replace("-", "") for r in chained_records} == {r.replace("-", "") for r in records}
    assert chained_events == events
    assert set(entries.values_list("run_id", flat=True)) == {f"run-{tenant.slug}"}
