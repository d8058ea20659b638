"""Issue 48, 3: two tenants writing at once (two writers each) lose no link and cross
none: each tenant's chain holds every one of its rows and none of the other's; and a
tenant whose chain head is locked by an open transaction does not hold up another's
calls (the head is per tenant, no global lock).

Threads with connections of their own on PostgreSQL, where writers run concurrently
(SQLite serialises them anyway)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from apps.audit.models import AuditEntry, AuditHead, AuditPending, Kind
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.models import Tenant
from tests.approvals.support import ECHO
from tests.audit.support import verify_audit
from tests.conftest import Agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg("postgresql")]

CALLS = 20
WRITERS = 2  # per tenant


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


def writer(agent: Agent, count: int = CALLS // WRITERS) -> Callable[[], None]:
    def write() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        for n in range(count):
            response = client.post(
                "/api/v1/invocations/",
                {"toolId": ECHO, "runId": f"run-{agent.tenant.slug}", "args": {"text": str(n)}},
                format="json",
            )
            assert response.status_code == 200, response.content

    return write


def test_two_tenants_writing_at_once_keep_whole_chains_of_their_own(caller, other):
    failures: list[BaseException] = []
    writers = [
        in_thread(writer(agent), failures) for agent in (caller, other) for _ in range(WRITERS)
    ]
    for thread in writers:
        thread.join()
    assert failures == []
    assert not AuditPending.objects.exists()  # linked as written: nothing left to link

    for tenant in (caller.tenant, other.tenant):
        assert_chain_holds_its_rows(tenant)
    code, out = verify_audit()
    assert code == 0, out


def test_a_tenant_holding_its_head_does_not_hold_up_another(caller, other):
    """An open transaction holds acme's chain head: globex's call completes meanwhile;
    acme's waits on acme's head (seen in pg_stat_activity), and completes once it is free."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers: a held head is PostgreSQL's question")
    writer(caller, 1)()  # both heads exist
    writer(other, 1)()
    failures: list[BaseException] = []
    holding, release = threading.Event(), threading.Event()
    holder_pid: list[int] = []

    def hold() -> None:
        with transaction.atomic():
            AuditHead.objects.select_for_update().get(tenant=caller.tenant)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                holder_pid.append(cursor.fetchone()[0])
            holding.set()
            release.wait(60)

    holder = in_thread(hold, failures)
    assert holding.wait(60)
    try:
        blocked = in_thread(writer(caller, 1), failures)
        waiting_on(holder_pid[0])
        free = in_thread(writer(other, 1), failures)
        free.join(60)
        assert not free.is_alive() and failures == []  # globex's call is done
        assert blocked.is_alive()  # acme's still waits for its head
    finally:
        release.set()
    holder.join(60)
    blocked.join(60)
    assert failures == [] and not blocked.is_alive()
    code, out = verify_audit()
    assert code == 0, out


def waiting_on(pid: int) -> None:
    """Until some backend waits for a lock the holder's backend holds."""
    for _ in range(600):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [pid],
            )
            if cursor.fetchone()[0]:
                return
        threading.Event().wait(0.05)
    raise AssertionError("no call waited for the held head")


def assert_chain_holds_its_rows(tenant: Tenant) -> None:
    entries = AuditEntry.objects.filter(tenant=tenant)
    assert sorted(entries.values_list("n", flat=True)) == list(range(1, entries.count() + 1))
    records = {
        str(pk)
        for pk in InvocationRecord.objects.filter(tenant=tenant).values_list("pk", flat=True)
    }
    events = {str(pk) for pk in RunEvent.objects.filter(tenant=tenant).values_list("pk", flat=True)}
    assert len(records) == CALLS // WRITERS * WRITERS and len(events) == 2 * len(records)
    chained_records = {
        str(r) for r in entries.filter(kind=Kind.RECORD).values_list("row_id", flat=True)
    }
    chained_events = set(entries.filter(kind=Kind.EVENT).values_list("row_id", flat=True))
    assert {r.replace("-", "") for r in chained_records} == {r.replace("-", "") for r in records}
    assert chained_events == events
    assert set(entries.values_list("run_id", flat=True)) == {f"run-{tenant.slug}"}


def test_transactions_writing_two_tenants_in_opposite_orders_do_not_deadlock(caller, other):
    """A worker's transaction ends one tenant's call and starts another's: two of them,
    in opposite orders, both commit (heads are taken at commit, in tenant order)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers")
    failures: list[BaseException] = []
    both_wrote_first = threading.Barrier(2, timeout=60)

    def write(first: Tenant, second: Tenant, run: str) -> Callable[[], None]:
        def work() -> None:
            with transaction.atomic():
                event(first, run, 1)
                both_wrote_first.wait()  # each holds a write of its first tenant
                event(second, run, 1)

        return work

    threads = [
        in_thread(write(caller.tenant, other.tenant, "run-ab"), failures),
        in_thread(write(other.tenant, caller.tenant, "run-ba"), failures),
    ]
    for thread in threads:
        thread.join(60)
    assert failures == []
    for tenant in (caller.tenant, other.tenant):
        runs = set(AuditEntry.objects.filter(tenant=tenant).values_list("run_id", flat=True))
        assert runs == {"run-ab", "run-ba"}
    code, out = verify_audit()
    assert code == 0, out


def event(tenant: Tenant, run_id: str, seq: int) -> None:
    RunEvent.objects.create(
        tenant=tenant,
        run_id=run_id,
        seq=seq,
        type="custom",
        tool_call_id="call-x",
        tool_id="test__echo",
        message={"type": "custom"},
        at=timezone.now(),
    )
