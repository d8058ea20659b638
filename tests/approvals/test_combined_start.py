"""On PostgreSQL a queued call's start (the earlier calls' ends, the claim, the record's
start, the event numbers and the events) is one statement (apps.invocations.combined,
issue 13 goal 6). It must write what the statements one by one write, lose a claim the
same way, and lose nothing when it fails."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from apps.approvals import decisions, tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations import combined
from apps.invocations.models import InvocationRecord, Run, RunEvent
from tests.approvals.support import (
    TALLY,
    drain_queue,
    event_types,
    events,
    hold,
    record_of,
    subscribed,
)
from tests.approvals.test_batches import approved
from tests.support.runs import take_next_number

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="one statement on PostgreSQL only"
    ),
]

RECORD_FIELDS = ("status", "ok", "result", "args", "request_hash", "error_code", "safe_message")


def outcome(caller: Any, approvals: list[ApprovalRequest]) -> list[dict[str, Any]]:
    """What a batch left behind, without ids and times."""
    found = []
    for approval in approvals:
        approval.refresh_from_db()
        record = record_of(approval)
        seen = events(caller.tenant, approval.run_id)
        found.append(
            {
                "approval": approval.status,
                "record": {name: getattr(record, name) for name in RECORD_FIELDS},
                "timed": record.started_at is not None and record.ended_at is not None,
                "events": [
                    {
                        key: value
                        for key, value in event.items()
                        if key not in ("at", "invocationId", "approvalId", "durationMs")
                    }
                    for event in seen
                ],
                "stored": [
                    (row.seq, row.type, row.message["seq"])
                    for row in RunEvent.objects.filter(
                        tenant=caller.tenant, run_id=approval.run_id
                    ).order_by("seq")
                ],
                "counter": Run.objects.get(tenant=caller.tenant, run_id=approval.run_id).last_seq,
            }
        )
    return found


def test_one_statement_writes_what_the_statements_one_by_one_write(
    caller, operator, tally, monkeypatch
):
    tokens = ["s0", "s1", "s2"]
    combined_batch = approved(caller, operator, tally, *tokens)
    with CaptureQueriesContext(connection) as sent:
        tasks.run_approved_calls([str(a.pk) for a in combined_batch])
    sqls = [q["sql"] for q in sent.captured_queries]
    starts = [sql for sql in sqls if sql.startswith("WITH claimed AS (UPDATE")]
    assert len(starts) == 3  # one statement per call's start
    # The last call's end, at the batch's end, is one statement too (Closing.flush), and
    # no event is numbered or written on its own.
    assert len([sql for sql in sqls if sql.startswith("WITH claimed AS (SELECT")]) == 1
    assert not [sql for sql in sqls if sql.startswith('INSERT INTO "invocations_run')]
    assert not [sql for sql in sqls if sql.startswith('UPDATE "invocations_invocationrecord"')]

    monkeypatch.setattr(combined, "available", lambda using="default": False)
    one_by_one = approved(caller, operator, tally, *[f"{token}-x" for token in tokens])
    tasks.run_approved_calls([str(a.pk) for a in one_by_one])

    left = outcome(caller, combined_batch)
    right = outcome(caller, one_by_one)
    for entry in right:  # the same calls under other run ids and tokens
        for event in entry["events"]:
            event["runId"] = event["runId"].removesuffix("-x")
            if "args" in event:
                event["args"] = {**event["args"], "token": event["args"]["token"][:-2]}
            if "result" in event and isinstance(event["result"], dict):
                event["result"] = {
                    key: value.removesuffix("-x") if isinstance(value, str) else value
                    for key, value in event["result"].items()
                }
    for mine, theirs in zip(left, right, strict=True):
        assert mine["approval"] == theirs["approval"] == ApprovalStatus.SUCCEEDED
        assert mine["timed"] and theirs["timed"]
        assert mine["stored"] == theirs["stored"]
        assert mine["counter"] == theirs["counter"]
        assert [e["type"] for e in mine["events"]] == [e["type"] for e in theirs["events"]]
        assert [e["seq"] for e in mine["events"]] == [e["seq"] for e in theirs["events"]]
        for name in ("status", "ok", "error_code", "safe_message"):
            assert mine["record"][name] == theirs["record"][name]
    assert [tally.count(token) for token in tokens] == [1, 1, 1]


def test_calls_of_one_run_are_numbered_in_order_without_gaps(caller, operator, tally):
    held = [
        hold(caller, TALLY, args=tally.args(f"r{n}"), runId="run-together")[1] for n in range(4)
    ]
    drain_queue()
    for approval in held:
        decisions.decide(approval.pk, operator, "approve")
    received = subscribed(caller.tenant, "run-together")

    tasks.run_approved_calls([str(a.pk) for a in held])
    seen = events(caller.tenant, "run-together")
    # What subscribers were pushed is what was stored, numbers included, in that order.
    pushed = [message["event"] for message in received()]
    assert [(e["type"], e["seq"]) for e in pushed] == [
        (e["type"], e["seq"]) for e in seen if e["type"].startswith("tool_call_")
    ]
    numbers = [event["seq"] for event in seen]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    calls = [e for e in seen if e["type"] in ("tool_call_start", "tool_call_result")]
    assert [e["type"] for e in calls] == ["tool_call_start", "tool_call_result"] * 4
    assert [e["toolCallId"] for e in calls] == [a.tool_call_id for a in held for _ in range(2)]
    stored = RunEvent.objects.filter(tenant=caller.tenant, run_id="run-together")
    assert all(row.message["seq"] == row.seq for row in stored)
    last = Run.objects.get(tenant=caller.tenant, run_id="run-together").last_seq
    assert last == numbers[-1]


def test_a_lost_claim_writes_the_earlier_end_and_no_start(caller, operator, tally, monkeypatch):
    """Call 2 is taken by someone else between its re-checks and its start: the statement
    still closes call 1, writes nothing of call 2, and uses none of its run's numbers."""
    first, second = approved(caller, operator, tally, "l0", "l1")
    before = Run.objects.get(tenant=caller.tenant, run_id="run-l1").last_seq
    waiting = record_of(second).status
    real = combined.write

    def write(updates, claim, claimed_updates, pending, at_epoch):
        if claim.row.pk == second.pk:  # another worker claims it first
            ApprovalRequest.objects.filter(pk=second.pk).update(status=ApprovalStatus.EXECUTING)
        return real(updates, claim, claimed_updates, pending, at_epoch)

    monkeypatch.setattr(combined, "write", write)
    outcomes = tasks.run_approved_calls([str(first.pk), str(second.pk)])

    assert outcomes[str(first.pk)] == ApprovalStatus.SUCCEEDED
    assert outcomes[str(second.pk)] == ApprovalStatus.EXECUTING  # not this worker's
    assert record_of(first).status == "succeeded" and record_of(first).ended_at is not None
    assert event_types(caller.tenant, "run-l0").count("tool_call_result") == 1
    assert tally.count("l1") == 0
    untouched = record_of(second)
    assert untouched.started_at is None and untouched.status == waiting
    assert "tool_call_start" not in event_types(caller.tenant, "run-l1")
    assert Run.objects.get(tenant=caller.tenant, run_id="run-l1").last_seq == before


def test_a_failing_statement_loses_nothing(caller, operator, tally):
    """The start of call 2 fails inside PostgreSQL (its event's number is taken): nothing
    of the statement stays, call 1's end is written on its own, and call 2 stays approved
    for a later worker."""
    first, second = approved(caller, operator, tally, "e0", "e1")
    waiting = record_of(second).status
    taken = take_next_number(caller.tenant, "run-e1", second.created_at).seq
    with pytest.raises(IntegrityError):
        tasks.run_approved_calls([str(first.pk), str(second.pk)])

    assert record_of(first).status == "succeeded"
    assert event_types(caller.tenant, "run-e0").count("tool_call_result") == 1
    second.refresh_from_db()
    assert second.status == ApprovalStatus.APPROVED and second.claimed_at is None
    record = InvocationRecord.objects.get(pk=record_of(second).pk)
    assert record.started_at is None and record.status == waiting
    assert tally.count("e1") == 0
    assert Run.objects.get(tenant=caller.tenant, run_id="run-e1").last_seq == taken - 1


def test_a_batch_reads_the_epoch_once_and_checks_each_later_call_at_the_one_its_start_saw(
    caller, operator, tally
):
    held = approved(caller, operator, tally, "p0", "p1", "p2")
    with CaptureQueriesContext(connection) as sent:
        outcomes = tasks.run_approved_calls([str(a.pk) for a in held])
    assert set(outcomes.values()) == {ApprovalStatus.SUCCEEDED}
    reads = [q for q in sent.captured_queries if q["sql"].startswith('SELECT "value" FROM')]
    assert len(reads) == 1  # the first call's; the others use their predecessor's answer


def test_an_edit_committed_after_a_start_holds_on_the_next_call(
    caller, operator, tally, monkeypatch
):
    """Call 2 is checked at the epoch call 1's statement saw, with the tool still enabled
    in the cache; the tool is disabled in between. The claim must miss on the epoch, and
    call 2 be checked again, refused, and never run."""
    from apps.tools.models import Tool

    first, second = approved(caller, operator, tally, "q0", "q1")
    real = combined.write
    answers: list[tuple[str, bool]] = []

    def write(updates, claim, claimed_updates, pending, at_epoch):
        started = real(updates, claim, claimed_updates, pending, at_epoch)
        answers.append((str(claim.row.pk), started.claimed))
        if claim.row.pk == first.pk:  # an admin, in another process, right after
            Tool.objects.filter(pk=TALLY).update(enabled=False)
        return started

    monkeypatch.setattr(combined, "write", write)
    outcomes = tasks.run_approved_calls([str(first.pk), str(second.pk)])

    assert answers == [(str(first.pk), True), (str(second.pk), False)]
    assert outcomes[str(first.pk)] == ApprovalStatus.SUCCEEDED
    assert tally.count("q0") == 1 and tally.count("q1") == 0
    refused = record_of(second)
    assert refused.status == "failed" and refused.error_code == "unavailable"
    assert "disabled" in refused.safe_message


def prepared_starts() -> dict[str, tuple[int, int]]:
    """The start statements this connection's session holds prepared (name -> how often
    PostgreSQL planned one anew, custom, and reused its one plan, generic); earlier tests
    on the same connection may have left some."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, custom_plans, generic_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'WITH claimed AS (UPDATE %%'"
        )
        return {name: (custom, generic) for name, custom, generic in cursor.fetchall()}


def runs_since(before: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Per prepared start, the custom and generic runs since `before`, where there were any."""
    after = prepared_starts()
    ran = {}
    for name, (custom, generic) in after.items():
        was = before.get(name, (0, 0))
        if (custom, generic) != was:
            ran[name] = (custom - was[0], generic - was[1])
    return ran


def test_the_start_is_prepared_once_per_connection_and_then_not_planned_again(
    caller, operator, tally
):
    """A queued call's start is the statement PostgreSQL sees most (toolhub/db/postgresql
    prepared_cursor): it is parsed once per connection and, after PostgreSQL's first five
    custom plans, run on its generic plan, its values bound on the server."""
    tokens = [f"p{n}" for n in range(10)]
    batch = approved(caller, operator, tally, *tokens)
    before = prepared_starts()
    with CaptureQueriesContext(connection) as sent:
        tasks.run_approved_calls([str(a.pk) for a in batch])

    assert [tally.count(token) for token in tokens] == [1] * 10
    assert all(a.status == ApprovalStatus.SUCCEEDED for a in ApprovalRequest.objects.all())
    starts = [q for q in sent.captured_queries if q["sql"].startswith("WITH claimed AS (UPDATE")]
    assert len(starts) == 10  # still seen by Django's query log (execute wrappers too)
    assert all("%s" not in q["sql"] and "$1" not in q["sql"] for q in starts)  # values shown
    ran = runs_since(before)
    # At most two shapes: a batch's first start carries no earlier end, the others one.
    assert 1 <= len(ran) <= 2
    assert sum(custom + generic for custom, generic in ran.values()) == 10
    assert sum(generic for _, generic in ran.values()) >= 4  # the 6th run on: no planning


def test_with_prepared_statements_turned_off_the_start_is_sent_unprepared(
    caller, operator, tally, monkeypatch
):
    """TOOLHUB_DB_PREPARED_STATEMENTS=0 leaves psycopg's prepare_threshold at Django's
    None (a transaction-mode pooler): the same statement, the same outcome, nothing kept
    by the session."""
    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", None)
    batch = approved(caller, operator, tally, "u0", "u1", "u2")
    before = prepared_starts()
    tasks.run_approved_calls([str(a.pk) for a in batch])
    assert [tally.count(token) for token in ("u0", "u1", "u2")] == [1, 1, 1]
    assert all(a.status == ApprovalStatus.SUCCEEDED for a in ApprovalRequest.objects.all())
    assert runs_since(before) == {}
    assert prepared_starts().keys() == before.keys()
