"""Issue 45: the sweeper, /metrics and the overview cost what happened since their last
look, not the history. Calls are counted as they end (database triggers into a queue the
sweeper folds into rollups); an idle sweep reads only indexes of rows that need work.

Work is counted, not timed: on SQLite the virtual machine's steps during the pass (a
progress handler), on PostgreSQL the rows each statement's plan read (EXPLAIN ANALYZE,
rows returned plus rows filtered out, per node)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.approvals import decisions, tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations import rollups, stats
from apps.invocations.models import (
    FINAL_STATUSES,
    CallEnd,
    CallMinute,
    CallTotal,
    InvocationRecord,
    RunEvent,
    Status,
)
from apps.tenants.models import Tenant
from tests.approvals.conftest import caller, operator, other, tools  # noqa: F401
from tests.approvals.support import CONFIRM, ECHO, events, hold
from tests.support.server import daphne, invoke

pytestmark = pytest.mark.django_db(transaction=True)

DENIED = "test__crash"  # registered, in no policy: refused with policy_denied
TOKEN = "metrics-token-0123456789abcdefghijklmnop"


# ---------------------------------------------------------------- measuring work


def work_of(action: Callable[[], Any]) -> tuple[int, int]:
    """(statements, work) of `action`: SQLite's VM steps, or PostgreSQL's rows read."""
    if connection.vendor == "sqlite":
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        connection.ensure_connection()
        raw = connection.connection
        with CaptureQueriesContext(connection) as queries:
            raw.set_progress_handler(count, 1)
            try:
                action()
            finally:
                raw.set_progress_handler(None, 1)
        return len(queries), steps[0]
    with CaptureQueriesContext(connection) as queries:
        action()
    statements = [q["sql"] for q in queries.captured_queries if _plannable(q["sql"])]
    rows = 0
    with transaction.atomic(), connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            rows += _rows_read(cursor.fetchone()[0][0]["Plan"])
        transaction.set_rollback(True)
    return len(queries), rows


def _plannable(sql: str) -> bool:
    return sql.split(None, 1)[0].upper() in {"SELECT", "UPDATE", "DELETE", "INSERT", "WITH"}


def _rows_read(node: dict[str, Any]) -> int:
    loops = node.get("Actual Loops", 1)
    read = node.get("Actual Rows", 0) + sum(
        node.get(key, 0) for key in ("Rows Removed by Filter", "Rows Removed by Index Recheck")
    )
    return read * loops + sum(_rows_read(child) for child in node.get("Plans", []))


def history(tenant: Tenant, calls: int, run_id: str = "run-session") -> None:
    """`calls` finished calls in one run (as an MCP session makes them), written directly,
    each with its start and result event."""
    now = timezone.now() - timedelta(hours=2)
    records = [
        InvocationRecord(
            tenant=tenant,
            tool_ref=ECHO,
            tool_call_id=f"call-{n}",
            run_id=run_id,
            principal="agent:test",
            status=Status.SUCCEEDED,
            ok=True,
            started_at=now,
            ended_at=now,
            duration_ms=n % 700,
        )
        for n in range(calls)
    ]
    InvocationRecord.objects.bulk_create(records, batch_size=500)
    RunEvent.objects.bulk_create(
        [
            RunEvent(
                tenant=tenant,
                run_id=run_id,
                seq=2 * n + kind,
                type=("tool_call_start", "tool_call_result")[kind - 1],
                tool_call_id=f"call-{n}",
                tool_id=ECHO,
                message={},
                at=now,
            )
            for n in range(calls)
            for kind in (1, 2)
        ],
        batch_size=500,
    )


def analyze(sqlite: bool = False) -> None:
    """Table statistics, as autovacuum keeps them on a live server; on SQLite too when
    `sqlite` (an operator may run ANALYZE, and the planner's choices change with it)."""
    if connection.vendor == "postgresql" or sqlite:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


# ---------------------------------------------------------------- idle passes


def test_an_idle_sweep_reads_no_more_after_thousands_of_calls_than_after_none(caller):  # noqa: F811
    tasks.sweep()
    analyze()
    statements_before, work_before = work_of(tasks.sweep)

    history(caller.tenant, 3000)
    for text in ("a", "b"):
        caller.invoke(ECHO, args={"text": text})
    caller.invoke(DENIED, args={})
    tasks.sweep()  # counts those calls: the work since the last pass
    analyze()
    statements_after, work_after = work_of(tasks.sweep)

    assert statements_after == statements_before
    # The one table an idle pass may read more of is the per-minute rollup (the minutes
    # older than a day, dropped): bounded by a day's minutes, not the history; while it
    # is tiny PostgreSQL reads it whole, and SQLite's range scan that finds nothing in a
    # non-empty index takes a few steps more. A scan of the history would be thousands.
    slack = CallMinute.objects.count() + (8 if connection.vendor == "sqlite" else 0)
    assert work_after <= work_before + slack, (work_before, work_after)


def test_an_idle_sweep_reads_no_more_after_thousands_of_decided_approvals(caller, operator):  # noqa: F811
    """Analyzed (as an operator may run ANALYZE on SQLite too), the sweeper's reads of
    approved and executing approvals stay on the rows in those states."""
    tasks.sweep()
    analyze(sqlite=True)
    statements_before, work_before = work_of(tasks.sweep)

    history(caller.tenant, 2000, run_id="run-held")
    now = timezone.now() - timedelta(hours=2)
    ApprovalRequest.objects.bulk_create(
        ApprovalRequest(
            tenant=caller.tenant,
            invocation=record,
            tool_id=CONFIRM,
            status=ApprovalStatus.SUCCEEDED,  # as most are: a status the stats cannot tell apart
            principal=record.principal,
            requested_by=operator,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            args={},
            original_args={},
            bound_hash="0" * 64,
            hold_reason="test",
            expires_at=now,
            decided_by=operator,
            decided_at=now,
        )
        for record in InvocationRecord.objects.filter(run_id="run-held")
    )
    tasks.sweep()
    analyze(sqlite=True)
    statements_after, work_after = work_of(tasks.sweep)

    assert statements_after == statements_before
    slack = CallMinute.objects.count() + (8 if connection.vendor == "sqlite" else 0)
    assert work_after <= work_before + slack, (work_before, work_after)


def test_a_scrape_reads_no_more_after_thousands_of_calls_than_after_one(caller):  # noqa: F811
    client = superuser_client()
    caller.invoke(ECHO, args={"text": "first"})
    hold(caller, CONFIRM, args={})  # in flight and pending, in every scrape
    tasks.sweep()
    analyze(sqlite=True)
    statements_before, work_before = work_of(lambda: client.get("/metrics"))

    history(caller.tenant, 3000)
    tasks.sweep()
    analyze(sqlite=True)  # analyzed, SQLite walked the tenant's history for calls in flight
    statements_after, work_after = work_of(lambda: client.get("/metrics"))

    assert statements_after == statements_before
    # The same rows (one total per tenant, tool and status); SQLite's steps vary with
    # the numbers' sizes only.
    assert work_after <= work_before * 1.05, (work_before, work_after)


# ---------------------------------------------------------------- repairs


def test_a_result_lost_between_a_records_end_and_its_event_is_emitted_once(caller):  # noqa: F811
    response = caller.invoke(ECHO, args={"text": "hi"}, runId="run-lost")
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    # As a crash between the two writes would leave it: the end, without its event.
    RunEvent.objects.filter(run_id="run-lost", type="tool_call_result").delete()

    assert tasks.repair_missing_results() == 1
    assert tasks.repair_missing_results() == 0

    stream = events(caller.tenant, "run-lost")
    assert [e["type"] for e in stream] == ["tool_call_start", "tool_call_result"]
    assert stream[-1]["invocationId"] == str(record.pk)
    assert CallEnd.objects.count() == 0


def test_a_record_ended_by_hand_gets_its_result_and_is_counted(caller):  # noqa: F811
    response = caller.invoke(ECHO, args={"text": "hi"}, runId="run-by-hand")
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    InvocationRecord.objects.filter(pk=record.pk).update(
        status=Status.RUNNING, ok=None, ended_at=None, duration_ms=None
    )
    RunEvent.objects.filter(run_id="run-by-hand", type="tool_call_result").delete()
    tasks.sweep()
    assert metrics_calls(caller.tenant.slug, ECHO) == {"succeeded": 0}

    InvocationRecord.objects.filter(pk=record.pk).update(
        status=Status.FAILED, ok=False, ended_at=timezone.now(), duration_ms=12
    )
    tasks.sweep()

    assert [e["type"] for e in events(caller.tenant, "run-by-hand")][-1] == "tool_call_result"
    assert metrics_calls(caller.tenant.slug, ECHO) == {"succeeded": 0, "failed": 1}


def test_an_interrupted_run_is_settled_and_counted_once(caller, operator):  # noqa: F811
    _, approval = hold(caller, CONFIRM, runId="run-interrupted")
    decisions.decide(approval.pk, operator, "approve")
    approval.refresh_from_db()
    approval.status = ApprovalStatus.EXECUTING
    approval.claimed_at = timezone.now() - timedelta(minutes=5)
    approval.save()

    assert tasks.sweep()["settled"] == 1
    tasks.sweep()

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.FAILED
    assert [e["type"] for e in events(caller.tenant, "run-interrupted")][-1] == "tool_call_result"
    assert metrics_calls(caller.tenant.slug, CONFIRM) == {"failed": 1}
    assert_metrics_match_records()


def test_an_abandoned_record_is_ended_and_counted_once(caller):  # noqa: F811
    response = caller.invoke(ECHO, args={"text": "hi"}, runId="run-abandoned")
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    tasks.sweep()
    InvocationRecord.objects.filter(pk=record.pk).update(
        status=Status.RUNNING, ok=None, ended_at=None, started_at=timezone.now()
    )
    assert metrics_calls(caller.tenant.slug, ECHO) == {"succeeded": 0}
    assert tasks.sweep()["settled"] == 0  # within its timeout
    InvocationRecord.objects.filter(pk=record.pk).update(
        started_at=timezone.now() - timedelta(minutes=10)
    )

    assert tasks.sweep()["settled"] == 1
    assert tasks.sweep()["settled"] == 0

    assert events(caller.tenant, "run-abandoned")[-1]["type"] == "tool_call_result"
    assert metrics_calls(caller.tenant.slug, ECHO) == {"succeeded": 0, "failed": 1}
    assert_metrics_match_records()


# ---------------------------------------------------------------- /metrics = the records


def superuser_client() -> Client:
    from django.contrib.auth.models import User

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-12345678"))
    return client


def scrape() -> dict[str, list[Any]]:
    with override_settings(TOOLHUB_METRICS_TOKEN=TOKEN):
        response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return {
        family.name: family.samples
        for family in text_string_to_metric_families(response.content.decode())
    }


def metrics_calls(tenant: str, tool: str) -> dict[str, float]:
    return {
        sample.labels["status"]: sample.value
        for sample in scrape()["toolhub_tool_calls"]
        if sample.labels["tenant"] == tenant and sample.labels["tool"] == tool
    }


def assert_metrics_match_records() -> None:
    """Every counter and histogram of /metrics equals what the records say."""
    families = scrape()
    calls = {
        (s.labels["tenant"], s.labels["tool"], s.labels["status"]): s.value
        for s in families["toolhub_tool_calls"]
        if s.name == "toolhub_tool_calls_total" and s.value
    }
    final = InvocationRecord.objects.filter(status__in=FINAL_STATUSES)
    expected = Counter(final.values_list("tenant__slug", "tool_ref", "status"))
    assert calls == dict(expected)

    histogram: dict[tuple[str, str, str], float] = {}
    for s in families["toolhub_tool_call_duration_seconds"]:
        key = (s.labels["tenant"], s.labels["tool"], s.name + s.labels.get("le", ""))
        histogram[key] = s.value
    durations: dict[tuple[str, str], list[int]] = defaultdict(list)
    for tenant, tool, ms in final.exclude(duration_ms=None).values_list(
        "tenant__slug", "tool_ref", "duration_ms"
    ):
        durations[(tenant, tool)].append(ms or 0)
    name = "toolhub_tool_call_duration_seconds"
    for (tenant, tool), values in durations.items():
        assert histogram[(tenant, tool, f"{name}_count")] == len(values)
        assert histogram[(tenant, tool, f"{name}_sum")] == pytest.approx(sum(values) / 1000)
        for bound in rollups.LATENCY_BUCKETS:
            within = sum(1 for ms in values if ms <= bound * 1000)
            assert histogram[(tenant, tool, f"{name}_bucket{float(bound)!r}")] == within
    assert {(t, tool) for t, tool, _ in histogram} == set(durations)


def test_metrics_equal_the_records_across_two_processes_and_folds(caller, other):  # noqa: F811
    caller.invoke(ECHO, args={"text": "here"})
    caller.invoke(DENIED, args={})
    other.invoke(ECHO, args={"text": "theirs"})
    with daphne() as server:
        for text in ("there", "again"):
            status, _, _ = invoke(server, caller.key, {"toolId": ECHO, "args": {"text": text}})
            assert status == 200
        status, _, _ = invoke(server, caller.key, {"toolId": DENIED, "args": {}})
        assert status == 200
        invoke(server, other.key, {"toolId": "test__crash", "args": {}})
    hold(caller, CONFIRM)  # in flight: not a counted call yet

    assert_metrics_match_records()  # nothing folded: read from the queue
    tasks.sweep()
    assert CallEnd.objects.count() == 0
    assert_metrics_match_records()  # everything folded
    caller.invoke(ECHO, args={"text": "after the fold"})
    assert_metrics_match_records()  # both

    assert metrics_calls("acme", ECHO) == {"succeeded": 4}
    assert metrics_calls("acme", DENIED) == {"failed": 2}
    in_flight = scrape()["toolhub_tool_calls_in_flight"]
    assert [(s.labels["tool"], s.labels["status"], s.value) for s in in_flight] == [
        (CONFIRM, "pending_approval", 1)
    ]


def test_calls_in_earlier_minutes_are_counted_once_in_totals_and_minutes(caller):  # noqa: F811
    history(caller.tenant, 5, run_id="run-earlier")  # ended two hours ago
    caller.invoke(ECHO, args={"text": "now"})
    tasks.sweep()
    caller.invoke(ECHO, args={"text": "later"})

    assert metrics_calls("acme", ECHO) == {"succeeded": 7}
    assert sum(row.calls for row in CallTotal.objects.all()) == 6
    window = stats.overview(Tenant.objects.all())
    succeeded = next(s for s in window["callsPerMinute"] if s["label"] == "succeeded")
    assert sum(succeeded["data"]) == 2  # the window holds the last 30 minutes only


def test_an_idempotent_replay_is_counted_once(caller):  # noqa: F811
    body = {"args": {"text": "once"}, "idempotencyKey": "key-1"}
    first = caller.invoke(ECHO, **body).json()
    again = caller.invoke(ECHO, **body).json()
    assert first["invocationId"] == again["invocationId"]
    tasks.sweep()
    caller.invoke(ECHO, **body)

    assert metrics_calls("acme", ECHO) == {"succeeded": 1}


def test_an_end_written_twice_is_counted_once_and_an_edited_one_moves(caller):  # noqa: F811
    from apps.invocations import statements
    from apps.invocations.runner import CLOSING_FIELDS

    response = caller.invoke(ECHO, args={"text": "hi"})
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    statements.update(record, CLOSING_FIELDS)  # the same end again (a retried write)
    assert CallEnd.objects.count() == 1
    tasks.sweep()

    InvocationRecord.objects.filter(pk=record.pk).update(status=Status.FAILED, duration_ms=2000)

    assert metrics_calls("acme", ECHO) == {"succeeded": 0, "failed": 1}
    assert_metrics_match_records()
    tasks.sweep()
    assert metrics_calls("acme", ECHO) == {"succeeded": 0, "failed": 1}
    assert_metrics_match_records()


def test_the_overview_reads_the_same_numbers_before_and_after_a_fold(caller, other):  # noqa: F811
    for text in ("a", "b", "c"):
        caller.invoke(ECHO, args={"text": text})
    for _ in range(2):
        caller.invoke(DENIED, args={})
    other.invoke(DENIED, args={})
    scope = Tenant.objects.filter(slug="acme")

    before = stats.overview(scope)
    tasks.sweep()
    after = stats.overview(scope)

    for key in ("callsPerMinute", "latencyByTool", "topDeniedTools", "topDeniedPrincipals"):
        assert json.dumps(before[key]) == json.dumps(after[key]), key
    assert after["topDeniedTools"] == [{"name": DENIED, "count": 2}]
    assert after["topDeniedPrincipals"] == [{"name": "agent:test", "count": 2}]
    assert sum(sum(s["data"]) for s in after["callsPerMinute"]) == 5


def test_per_minute_rollups_older_than_a_day_are_dropped(caller):  # noqa: F811
    caller.invoke(ECHO, args={"text": "hi"})
    tasks.sweep()
    [row] = CallMinute.objects.all()
    assert rollups.forget_old_minutes(row.minute + rollups.MINUTES_KEPT) == 0
    later = row.minute + rollups.MINUTES_KEPT + timedelta(minutes=1)
    assert rollups.forget_old_minutes(later) == 1
    assert metrics_calls("acme", ECHO) == {"succeeded": 1}  # the totals stay
