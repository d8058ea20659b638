"""On PostgreSQL a worker starts the consecutive calls of its batch whose tools never wait
(ToolContract.runs_inline) in one statement: every call's re-checks at one epoch, then
their claims, their records' starts, their tool_call_start events and the earlier calls'
ends together, then the claimed ones run one after the other (runner.resume_together,
combined.write_many; issue 13, goal 6). It must write what the calls one by one write,
lose a claim the same way, hold an edit, send a refused call one by one, and lose
nothing when it fails."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from apps.approvals import decisions, tasks, worker
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations import combined, runner
from apps.invocations.models import InvocationRecord, Run, RunEvent
from apps.policies.models import Outcome, Policy
from apps.tools.models import Tool
from tests.approvals.support import (
    TALLY,
    TEST_TOOLS,
    add_rule,
    drain_queue,
    event_types,
    events,
    hold,
    make_operator,
    queue_entries,
    record_of,
    subscribed,
)
from tests.approvals.test_combined_start import outcome
from tests.approvals.tools import INLINE_RUNS
from tests.conftest import allow
from tests.support.runs import take_next_number

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="one statement on PostgreSQL only"
    ),
]

INLINE = "test__inline_tally"  # runs inline, always held; counts its runs in this process
TOGETHER = "WITH claim0 AS (UPDATE"  # several claims in one statement
ONE = "WITH claimed AS (UPDATE"  # one call's start


@pytest.fixture
def inline(caller):
    allow(caller.tenant, INLINE, name="inline")
    INLINE_RUNS.clear()
    yield caller
    INLINE_RUNS.clear()


@pytest.fixture
def operator(inline):
    """Staff member of `acme` with decide_approval on the test tools and INLINE."""
    return make_operator("olga", inline.tenant, tools=(*TEST_TOOLS, INLINE))


def held_inline(caller, *tokens: str, run_id: str | None = None) -> list[ApprovalRequest]:
    return [
        hold(caller, INLINE, args={"token": token}, runId=run_id or f"run-{token}")[1]
        for token in tokens
    ]


def approve(operator, *held: ApprovalRequest) -> list[ApprovalRequest]:
    """Approved, the operators' notifications drained first (an approved call's own queue
    entry is left for the test to run)."""
    drain_queue()
    for approval in held:
        decisions.decide(approval.pk, operator, "approve")
    return list(held)


def approved_inline(caller, operator, *tokens: str, run_id: str | None = None):
    return approve(operator, *held_inline(caller, *tokens, run_id=run_id))


def starts(sent: CaptureQueriesContext) -> tuple[list[str], list[str]]:
    sqls = [q["sql"] for q in sent.captured_queries]
    return [s for s in sqls if s.startswith(TOGETHER)], [s for s in sqls if s.startswith(ONE)]


def ran() -> dict[str, int]:
    """test__inline_tally's runs per token, in this process."""
    return dict(INLINE_RUNS)


def same(event: dict[str, Any]) -> dict[str, Any]:
    """An event without what differs between two calls made alike (ids and times; the
    receipt signs both)."""
    return {
        key: value
        for key, value in event.items()
        if key not in ("toolCallId", "expiresAt", "receipt")
    }


def ids(approvals: list[ApprovalRequest]) -> list[str]:
    return [str(approval.pk) for approval in approvals]


def test_inline_calls_start_in_one_statement_and_write_what_the_calls_one_by_one_write(
    inline, operator, monkeypatch
):
    tokens = ["s0", "s1", "s2", "s3"]
    together = approved_inline(inline, operator, *tokens)
    with CaptureQueriesContext(connection) as sent:
        outcomes = tasks.run_approved_calls(ids(together))
    grouped, single = starts(sent)
    assert len(grouped) == 1 and not single  # four starts, one statement
    assert len(re.findall(r"\bclaim\d+ AS \(", grouped[0])) == 4  # four claims in it
    # The four ends are one statement at the batch's end; nothing is written on its own.
    sqls = [q["sql"] for q in sent.captured_queries]
    assert len([sql for sql in sqls if sql.startswith("WITH claimed AS (SELECT")]) == 1
    assert not [sql for sql in sqls if sql.startswith('INSERT INTO "invocations_run')]
    assert not [sql for sql in sqls if sql.startswith('UPDATE "invocations_invocationrecord"')]
    assert set(outcomes.values()) == {ApprovalStatus.SUCCEEDED}

    monkeypatch.setattr(runner, "runs_inline", lambda tool_id: False)
    one_by_one = approved_inline(inline, operator, *[f"{token}-x" for token in tokens])
    with CaptureQueriesContext(connection) as sent:
        tasks.run_approved_calls(ids(one_by_one))
    grouped, single = starts(sent)
    assert not grouped and len(single) == 4

    left, right = outcome(inline, together), outcome(inline, one_by_one)
    for entry in right:  # the same calls under other run ids and tokens
        for event in entry["events"]:
            event["runId"] = event["runId"].removesuffix("-x")
            if "args" in event:
                event["args"] = {"token": event["args"]["token"].removesuffix("-x")}
            if isinstance(event.get("result"), dict):
                event["result"] = {"token": event["result"]["token"].removesuffix("-x")}
        entry["record"]["args"] = {"token": entry["record"]["args"]["token"].removesuffix("-x")}
        entry["record"]["result"] = {"token": entry["record"]["result"]["token"].removesuffix("-x")}
    for mine, theirs in zip(left, right, strict=True):
        assert mine["approval"] == theirs["approval"] == ApprovalStatus.SUCCEEDED
        assert mine["timed"] and theirs["timed"]
        assert [same(event) for event in mine["events"]] == [
            same(event) for event in theirs["events"]
        ]
        assert mine["stored"] == theirs["stored"]
        assert mine["counter"] == theirs["counter"]
        for name in ("status", "ok", "error_code", "safe_message", "args", "result"):
            assert mine["record"][name] == theirs["record"][name]
    assert ran() == dict.fromkeys(tokens, 1) | dict.fromkeys([f"{t}-x" for t in tokens], 1)


def test_calls_of_one_run_started_together_are_numbered_in_order_without_gaps(inline, operator):
    held = approved_inline(inline, operator, "r0", "r1", "r2", "r3", run_id="run-together")
    received = subscribed(inline.tenant, "run-together")

    tasks.run_approved_calls(ids(held))
    seen = events(inline.tenant, "run-together")
    pushed = [message["event"] for message in received()]
    calls = [e for e in seen if e["type"] in ("tool_call_start", "tool_call_result")]
    # What subscribers were pushed is what was stored, numbers included, in that order.
    assert [(e["type"], e["seq"]) for e in pushed] == [(e["type"], e["seq"]) for e in calls]
    numbers = [event["seq"] for event in seen]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    # Started together, so their starts come first, each call's result after its start.
    assert [e["type"] for e in calls] == ["tool_call_start"] * 4 + ["tool_call_result"] * 4
    order = [a.tool_call_id for a in held]
    assert [e["toolCallId"] for e in calls] == order + order
    stored = RunEvent.objects.filter(tenant=inline.tenant, run_id="run-together")
    assert all(row.message["seq"] == row.seq for row in stored)
    last = Run.objects.get(tenant=inline.tenant, run_id="run-together").last_seq
    assert last == numbers[-1]


def test_a_claim_lost_in_the_group_leaves_that_call_alone_and_the_others_run(
    inline, operator, monkeypatch
):
    """Call 2 is taken by another worker (or cancelled) between the group's re-checks and
    its statement: the statement starts calls 1 and 3, writes nothing of call 2 and uses
    none of its run's numbers."""
    first, second, third = approved_inline(inline, operator, "l0", "l1", "l2")
    before = Run.objects.get(tenant=inline.tenant, run_id="run-l1").last_seq
    waiting = record_of(second).status
    real = combined.write_many

    def write_many(using, updates, claims, pending, at_epoch, *more, **options):
        if claims:  # the group's start (the batch's last ends come here too)
            ApprovalRequest.objects.filter(pk=second.pk).update(status=ApprovalStatus.EXECUTING)
        started = real(using, updates, claims, pending, at_epoch, *more, **options)
        if claims:
            assert started is not None and started.applied == [True, False, True]
        return started

    monkeypatch.setattr(combined, "write_many", write_many)
    outcomes = tasks.run_approved_calls(ids([first, second, third]))

    assert outcomes[str(first.pk)] == outcomes[str(third.pk)] == ApprovalStatus.SUCCEEDED
    assert outcomes[str(second.pk)] == ApprovalStatus.EXECUTING  # not this worker's
    assert ran() == {"l0": 1, "l2": 1}
    for approval in (first, third):
        assert record_of(approval).status == "succeeded"
        assert event_types(inline.tenant, approval.run_id).count("tool_call_result") == 1
    untouched = record_of(second)
    assert untouched.started_at is None and untouched.status == waiting
    assert "tool_call_start" not in event_types(inline.tenant, "run-l1")
    assert Run.objects.get(tenant=inline.tenant, run_id="run-l1").last_seq == before
    second.refresh_from_db()
    assert second.claimed_at is None  # the in-memory claim was undone, never written


def test_an_edit_committed_before_the_groups_statement_holds_on_every_call(
    inline, operator, monkeypatch
):
    """The group is checked with the tool still enabled; an admin disables it before the
    statement runs. Every claim must miss on the epoch, the calls be checked again,
    refused, and none run."""
    held = approved_inline(inline, operator, "q0", "q1", "q2")
    real = combined.write_many
    answers: list[list[bool]] = []

    def write_many(using, updates, claims, pending, at_epoch, *more, **options):
        if claims and not answers:  # an admin, in another process, right before
            Tool.objects.filter(pk=INLINE).update(enabled=False)
        started = real(using, updates, claims, pending, at_epoch, *more, **options)
        if claims:
            answers.append(started.applied)
        return started

    monkeypatch.setattr(combined, "write_many", write_many)
    outcomes = tasks.run_approved_calls(ids(held))

    assert answers == [[False, False, False]]  # checked again: refused, so one by one
    assert set(outcomes.values()) == {ApprovalStatus.FAILED}
    assert not ran()
    for approval in held:
        refused = record_of(approval)
        assert refused.status == "failed" and refused.error_code == "unavailable"
        assert "disabled" in refused.safe_message
        assert event_types(inline.tenant, approval.run_id).count("tool_call_result") == 1


def test_a_call_refused_by_its_checks_sends_its_group_one_by_one(inline, operator):
    """A rule added after the approvals denies call 2: nothing of the group is started
    together; calls 1 and 3 run, call 2 is recorded as refused and never runs."""
    held = approved_inline(inline, operator, "d0", "d1", "d2")
    policy = Policy.objects.get(tenant=inline.tenant, name="inline")
    add_rule(policy, 'args.token == "d1"', Outcome.DENY, INLINE)
    with CaptureQueriesContext(connection) as sent:
        outcomes = tasks.run_approved_calls(ids(held))
    grouped, single = starts(sent)
    assert not grouped and len(single) == 2  # d0 and d2, each on its own
    assert [outcomes[pk] for pk in ids(held)] == [
        ApprovalStatus.SUCCEEDED,
        ApprovalStatus.FAILED,
        ApprovalStatus.SUCCEEDED,
    ]
    assert ran() == {"d0": 1, "d2": 1}
    refused = record_of(held[1])
    assert refused.status == "failed" and refused.error_code == "policy_denied"


def test_only_consecutive_inline_calls_start_together(inline, operator, tally):
    """A batch of inline i0, threaded t1, inline i2 and i3: i0 alone and t1 start one by
    one (t1 on a tool thread), i2 and i3 together."""
    threaded = hold(inline, TALLY, args=tally.args("t1"), runId="run-t1")[1]
    batch = [*held_inline(inline, "i0"), threaded, *held_inline(inline, "i2", "i3")]
    approve(operator, *batch)
    with CaptureQueriesContext(connection) as sent:
        outcomes = tasks.run_approved_calls(ids(batch))
    grouped, single = starts(sent)
    assert len(single) == 2 and len(grouped) == 1
    assert len(re.findall(r"\bclaim\d+ AS \(", grouped[0])) == 2  # two approvals claimed
    assert set(outcomes.values()) == {ApprovalStatus.SUCCEEDED}
    assert ran() == {"i0": 1, "i2": 1, "i3": 1} and tally.count("t1") == 1
    for approval in batch:
        assert event_types(inline.tenant, approval.run_id).count("tool_call_result") == 1


def test_a_failing_group_statement_loses_nothing(inline, operator, tally):
    """The group's statement fails inside PostgreSQL (an event number it needs is taken):
    nothing of it stays. The threaded call before it, whose end it carried, is ended on
    its own; the group's calls stay approved, unstarted, for a later worker."""
    threaded = hold(inline, TALLY, args=tally.args("e0"), runId="run-e0")[1]
    group = held_inline(inline, "e1", "e2")
    approve(operator, threaded, *group)
    taken = take_next_number(inline.tenant, "run-e2", group[1].created_at).seq
    with pytest.raises(IntegrityError):
        tasks.run_approved_calls(ids([threaded, *group]))

    assert record_of(threaded).status == "succeeded" and tally.count("e0") == 1
    assert event_types(inline.tenant, "run-e0").count("tool_call_result") == 1
    assert not ran()
    for approval in group:
        waiting = record_of(approval).status
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.APPROVED and approval.claimed_at is None
        record = InvocationRecord.objects.get(pk=record_of(approval).pk)
        assert record.started_at is None and record.status == waiting
        assert not RunEvent.objects.filter(
            tenant=inline.tenant, run_id=approval.run_id, type="tool_call_start"
        ).exists()
    assert Run.objects.get(tenant=inline.tenant, run_id="run-e2").last_seq == taken - 1


def test_a_call_that_breaks_does_not_keep_the_rest_of_its_group_from_running(
    inline, operator, monkeypatch
):
    """Every call of the group is started (claimed) by its statement, so each must run
    even if one before it raises: the error still reaches the worker afterwards."""
    held = approved_inline(inline, operator, "b0", "b1", "b2")
    real = runner.run_started

    def run_started(call):
        if call.params.token == "b1":
            raise RuntimeError("broken")
        return real(call)

    monkeypatch.setattr(runner, "run_started", run_started)
    with pytest.raises(RuntimeError):
        tasks.run_approved_calls(ids(held))
    assert ran() == {"b0": 1, "b2": 1}
    for approval in (held[0], held[2]):
        assert record_of(approval).status == "succeeded"  # ended by the batch's flush
        assert event_types(inline.tenant, approval.run_id).count("tool_call_result") == 1
    broken = ApprovalRequest.objects.get(pk=held[1].pk)
    assert broken.status == ApprovalStatus.EXECUTING  # started: the sweeper settles it


def test_a_worker_runs_a_batch_of_inline_calls_together_and_ends_every_entry(inline, operator):
    held = approved_inline(inline, operator, *[f"w{n}" for n in range(6)])
    runner_worker = worker.build_worker("together", batch=True, interval=0, claim_batch=16)
    with CaptureQueriesContext(connection) as sent:
        assert runner_worker.run_next() is not None
    grouped, single = starts(sent)
    assert len(grouped) == 1 and not single
    assert runner_worker.run_next() is None
    for approval in held:
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED
        assert [entry.status for entry in queue_entries(approval)] == ["SUCCESSFUL"]
    assert ran() == {f"w{n}": 1 for n in range(6)}
