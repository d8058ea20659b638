"""The superuser's lists of the history tables read one page from an index (issue 45).

Records and approvals are listed newest first over every tenant (`created_at DESC, id
DESC`): `*_newest_idx` serves that order, so a page (a deep one too) reads its rows and
no sort of the table. Events are listed by the (tenant, run_id, seq) index. A search by
a whole id is an index lookup in every tenant. The sweeper's reads of unfinished calls
and of waiting approvals must not walk the new indexes (SQLite's planner would, for a
query ordered newest first: tests/invocations/test_flat_cost.py), so they are unordered.

Plans are read with EXPLAIN on both databases, after ANALYZE, as a live server has them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.approvals import tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.admin.support import queries_per_page_size
from tests.support.times import own_times

pytestmark = pytest.mark.django_db

RECORDS = "/admin/invocations/invocationrecord/"
EVENTS = "/admin/invocations/runevent/"
APPROVALS = "/admin/approvals/approvalrequest/"
TENANTS = 4
CALLS = 2000  # 20 pages of 100
HELD_EVERY = 10  # 200 approvals: 2 pages


@pytest.fixture
def history(django_user_model: type[User]) -> User:
    """CALLS records over TENANTS tenants, a second apart, each with three events (runs
    of ten calls); one in HELD_EVERY held for an approval. Returns a superuser."""
    root = django_user_model.objects.create_superuser("root", "r@example.com", "pw")
    tool, _ = Tool.objects.get_or_create(
        id="core__get_current_time",
        defaults={"name": "get_current_time", "input_schema": {}, "schema_hash": "0" * 16},
    )
    tenants = [Tenant.objects.create(slug=f"h{n}", name=f"History {n}") for n in range(TENANTS)]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    records, events, approvals = [], [], []
    for i in range(CALLS):
        tenant, at = tenants[i % TENANTS], start + timedelta(seconds=i)
        run, call = f"run-{i // 10}", f"call-{i}"
        record = InvocationRecord(
            id=uuid.uuid4(), tenant=tenant, tool_ref="core__get_current_time",
            tool_call_id=call, run_id=run, principal="agent:h", status="succeeded",
            ok=True, created_at=at, started_at=at, ended_at=at, duration_ms=1,
        )  # fmt: skip
        records.append(record)
        events += [
            RunEvent(
                tenant=tenant,
                run_id=run,
                seq=3 * (i % 10) + k,
                type=kind,
                tool_call_id=call,
                tool_id="core__get_current_time",
                message={},
                at=at,
            )
            for k, kind in enumerate(("tool_call_start", "tool_call_progress", "tool_call_result"))
        ]
        if i % HELD_EVERY == 0:
            approvals.append(
                ApprovalRequest(
                    tenant=tenant,
                    invocation=record,
                    tool=tool,
                    principal="agent:h",
                    status=ApprovalStatus.SUCCEEDED,
                    requested_by=root,
                    run_id=run,
                    tool_call_id=call,
                    args={},
                    original_args={},
                    bound_hash="0" * 64,
                    expires_at=at + timedelta(minutes=15),
                    decided_by=root,
                    decided_at=at,
                    created_at=at,
                )
            )
    with own_times(InvocationRecord, ApprovalRequest):
        InvocationRecord.objects.bulk_create(records, batch_size=500)
        RunEvent.objects.bulk_create(events, batch_size=500)
        ApprovalRequest.objects.bulk_create(approvals, batch_size=500)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # statistics, as a live server keeps them
    return root


@pytest.fixture
def root(history: User) -> Client:
    client = Client()
    client.force_login(history)
    return client


def plan(sql: str, *, as_if_large: bool = True) -> str:
    """The database's plan for `sql`, one line per step.

    PostgreSQL reads a table of a test's size whole whatever its indexes (cheaper while
    it is small): `as_if_large` asks for the plan with table scans and sorts discouraged,
    so what is left shows whether an index answers the query without either (a query no
    index serves still scans and sorts)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        settings = ("enable_seqscan", "enable_sort") if as_if_large else ()
        for name in settings:
            cursor.execute(f"SET {name} = off")
        try:
            cursor.execute(f"EXPLAIN {sql}")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            for name in settings:
                cursor.execute(f"RESET {name}")


def page_query(client: Client, path: str, table: str, **params: str) -> tuple[Any, str]:
    """The response, and the statement that read the page's rows (ordered; limited when
    the list has more than one page)."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path, params)
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT")
        and f'FROM "{table}"' in q["sql"]
        and "ORDER BY" in q["sql"]
        and "COUNT(" not in q["sql"]
    ]
    assert len(reads) == 1, [q["sql"][-300:] for q in queries.captured_queries]
    return response, reads[0]


def reads_by(found: str, index: str) -> bool:
    """The plan reads through `index` and sorts nothing."""
    sorts = "USE TEMP B-TREE" in found if connection.vendor == "sqlite" else "Sort" in found
    return index in found and not sorts


def no_full_scan(found: str, table: str) -> bool:
    if connection.vendor == "sqlite":
        return not any(
            line.strip().startswith(f"SCAN {table}") and "INDEX" not in line
            for line in found.splitlines()
        )
    return f"Seq Scan on {table}" not in found


@pytest.mark.parametrize(
    ("path", "table", "index"),
    [
        (RECORDS, "invocations_invocationrecord", "invocations_newest_idx"),
        (APPROVALS, "approvals_approvalrequest", "approvals_newest_idx"),
    ],
)
def test_a_superusers_page_reads_the_newest_index_at_any_depth(root, path, table, index) -> None:
    last = {RECORDS: CALLS, APPROVALS: CALLS // HELD_EVERY}[path] // 100
    for page in ("1", str(last)):  # ?p= counts from 1
        response, sql = page_query(root, path, table, p=page)
        assert response.status_code == 200
        assert "ORDER BY" in sql and "DESC" in sql
        found = plan(sql)
        assert reads_by(found, index), (page, sql, found)
    # The last page holds the oldest rows; a page past the end is refused, not a 500.
    beyond = root.get(path, {"p": str(last + 5)})
    assert beyond.status_code == 302 and "e=1" in beyond["Location"]


def test_the_events_page_reads_by_run_without_sorting(root) -> None:
    for page in ("1", str(3 * CALLS // 100)):
        response, sql = page_query(root, EVENTS, "invocations_runevent", p=page)
        assert response.status_code == 200
        found = plan(sql)
        sorted_ = "USE TEMP B-TREE" in found if connection.vendor == "sqlite" else "Sort" in found
        assert not sorted_ and "tenants_tenant" not in sql.split("ORDER BY")[1], (sql, found)
        assert no_full_scan(found, "invocations_runevent") or "unique_event_seq" in found


@pytest.mark.parametrize(
    ("path", "table", "term", "expected"),
    [
        (RECORDS, "invocations_invocationrecord", "run-7", 10),
        (RECORDS, "invocations_invocationrecord", "call-77", 1),
        (EVENTS, "invocations_runevent", "run-7", 30),
        (EVENTS, "invocations_runevent", "call-77", 3),
        (APPROVALS, "approvals_approvalrequest", "run-7", 1),
        (APPROVALS, "approvals_approvalrequest", "call-70", 1),
    ],
)
def test_an_id_search_is_an_index_lookup_in_every_tenant(root, path, table, term, expected) -> None:
    response, sql = page_query(root, path, table, q=term)
    assert response.status_code == 200
    assert response.context["cl"].result_count == expected
    found = plan(sql)
    assert no_full_scan(found, table), (sql, found)
    if table == "invocations_runevent":
        # The tenants holding the run are found first (a probe each), so the page names
        # them as constants: with every tenant as a subquery, PostgreSQL walked the whole
        # (tenant, run_id, seq) index for the run (200 ms over 3 x 10^7 events).
        assert f'"{table}"."tenant_id" IN (SELECT' not in sql, sql
        if term.startswith("run-"):  # no call has that id: the run's rows, no OR
            assert '"tool_call_id" =' not in sql.split(" WHERE ", 1)[1], sql


def test_a_long_runs_search_reads_its_newest_rows_without_sorting_the_run(root) -> None:
    """One tenant's run of many calls: the tenants holding the run are found first (one
    probe each), so the page reads the run's newest entries of invocations_run_newest_idx
    in order. The same run id in a second tenant is found there too."""
    first, second = Tenant.objects.order_by("pk")[:2]
    at = datetime(2026, 2, 1, tzinfo=UTC)  # after the fixture's history, before now
    long_run = [
        InvocationRecord(
            id=uuid.uuid4(), tenant=first, tool_ref="core__get_current_time",
            tool_call_id=f"long-{i}", run_id="run-long", principal="agent:h",
            status="succeeded", ok=True, created_at=at + timedelta(seconds=i),
        )
        for i in range(300)
    ]  # fmt: skip
    with own_times(InvocationRecord):
        InvocationRecord.objects.bulk_create(long_run)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    response, sql = page_query(root, RECORDS, "invocations_invocationrecord", q="run-long")
    assert response.context["cl"].result_count == 300
    shown = [row.tool_call_id for row in response.context["cl"].result_list]
    assert shown[:2] == ["long-299", "long-298"] and len(shown) == 100
    found = plan(sql)
    assert reads_by(found, "invocations_run_newest_idx"), (sql, found)
    elsewhere = InvocationRecord.objects.create(
        tenant=second, tool_ref="core__get_current_time", tool_call_id="long-x",
        run_id="run-long", principal="agent:h", status="succeeded", ok=True,
    )  # fmt: skip
    response = root.get(RECORDS, {"q": "run-long"})
    assert response.context["cl"].result_count == 301
    assert response.context["cl"].result_list[0].pk == elsewhere.pk  # the newest
    assert root.get(RECORDS, {"q": "run-nowhere"}).context["cl"].result_count == 0


def test_an_id_search_by_invocation_id_finds_its_record_and_approval(root) -> None:
    held = ApprovalRequest.objects.order_by("created_at").first()
    assert held is not None
    for path, table in (
        (RECORDS, "invocations_invocationrecord"),
        (APPROVALS, "approvals_approvalrequest"),
    ):
        response, sql = page_query(root, path, table, q=str(held.invocation_id))
        assert response.context["cl"].result_count == 1
        assert no_full_scan(plan(sql), table), sql


def test_a_search_for_part_of_a_text_reads_no_row(root) -> None:
    """Part of a principal, or an id's prefix: the list says how it is searched, and the
    page's statement finds nothing without reading the table (no LIKE, no scan)."""
    for path, table in (
        (RECORDS, "invocations_invocationrecord"),
        (EVENTS, "invocations_runevent"),
        (APPROVALS, "approvals_approvalrequest"),
    ):
        for term in ("agent", "run-", "%", "call-1%"):
            with CaptureQueriesContext(connection) as queries:
                response = root.get(path, {"q": term})
            assert response.status_code == 200
            assert response.context["cl"].result_count == 0
            assert "searched by whole ids only" in response.content.decode()
            for q in queries.captured_queries:
                assert " LIKE " not in q["sql"].upper(), q["sql"]
                if f'FROM "{table}"' in q["sql"] and q["sql"].startswith("SELECT"):
                    assert no_full_scan(plan(q["sql"]), table), q["sql"]


def test_a_page_takes_as_many_queries_with_more_rows(root) -> None:
    """A list makes the same queries for a page of 10 rows as for 100 (no per-row query)."""
    from apps.approvals.admin import ApprovalRequestAdmin
    from apps.invocations.admin import InvocationRecordAdmin, RunEventAdmin

    for path, model_admin in (
        (RECORDS, InvocationRecordAdmin),
        (EVENTS, RunEventAdmin),
        (APPROVALS, ApprovalRequestAdmin),
    ):
        counts = queries_per_page_size(root, path, model_admin)
        assert counts[0] == counts[1], (path, counts)


def test_the_sweeper_walks_neither_newest_index(history) -> None:
    """Its reads of unfinished calls and waiting approvals are unordered: ordered newest
    first (the models' ordering), a planner may read the history by `*_newest_idx`."""
    with CaptureQueriesContext(connection) as queries:
        tasks.sweep()
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert any("invocations_invocationrecord" in sql for sql in reads)
    assert any("approvals_approvalrequest" in sql for sql in reads)
    for sql in reads:
        found = plan(sql, as_if_large=False)
        assert "newest_idx" not in found, (sql, found)


def test_the_overview_reads_the_waiting_approvals_by_index(history) -> None:
    """Which approvals waited during its window: those not decided and those decided since
    it began, read by approvals_decided_idx, not every approval ever made (issue 45: at
    10^5 approvals this was most of the overview)."""
    from apps.invocations import stats

    with CaptureQueriesContext(connection) as queries:
        stats.overview(Tenant.objects.all())
    [spans] = [
        q["sql"]
        for q in queries.captured_queries
        if 'FROM "approvals_approvalrequest"' in q["sql"] and "decided_at" in q["sql"]
    ]
    found = plan(spans)
    assert "approvals_decided_idx" in found and no_full_scan(found, "approvals_approvalrequest"), (
        spans,
        found,
    )
