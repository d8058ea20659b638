"""A worker claims several queue entries in one statement and runs their approved calls
as one batch (issue 13, goal 6): every call is still claimed after its own re-checks in
the transaction that records its start, a cancel that lands before that claim wins, a
batch whose worker died is enqueued again after a short lease, and the batch costs
fewer statements per call than one entry at a time."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals import decisions, tasks, wake, worker
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations import runner
from tests.approvals.support import (
    TALLY,
    drain_queue,
    event_types,
    events,
    hold,
    queue_entries,
    record_of,
)
from tests.support.threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def approved(caller, operator, tally, *tokens: str) -> list[ApprovalRequest]:
    """Held calls of test__tally, one per token, all approved; the notifications drained."""
    held = [
        hold(caller, TALLY, args=tally.args(token), runId=f"run-{token}")[1] for token in tokens
    ]
    drain_queue()  # the operators' notifications
    for approval in held:
        decisions.decide(approval.pk, operator, "approve")
    return held


def test_a_worker_claims_a_batch_in_one_go_and_runs_each_call_once(caller, operator, tally):
    tokens = ("b0", "b1", "b2", "b3")
    held = approved(caller, operator, tally, *tokens)
    claimer = worker.build_worker("batcher", batch=True, interval=0, claim_batch=3)

    with CaptureQueriesContext(connection) as claiming:
        batch = claimer.claim_many(claimer.claim_batch)

    assert [entry.args_kwargs["args"][0] for entry in batch] == [str(a.pk) for a in held[:3]]
    assert all(entry.status == "RUNNING" and entry.worker_ids == ["batcher"] for entry in batch)
    if connection.vendor == "postgresql":
        assert len(claiming.captured_queries) == 1  # one statement claims the batch
    claimer.run_entries(batch)
    assert claimer.run_next() is not None  # the fourth
    assert claimer.run_next() is None

    assert [tally.count(token) for token in tokens] == [1, 1, 1, 1]
    for approval, token in zip(held, tokens, strict=True):
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED
        assert record_of(approval).status == "succeeded"
        assert [entry.status for entry in queue_entries(approval)] == ["SUCCESSFUL"]
        assert queue_entries(approval)[0].return_value == "succeeded"
        types = event_types(caller.tenant, f"run-{token}")
        assert (types.count("tool_call_start"), types.count("tool_call_result")) == (1, 1)
    drain_queue()
    assert [tally.count(token) for token in tokens] == [1, 1, 1, 1]


def test_a_cancel_that_lands_after_the_batch_is_claimed_but_before_its_call_is_wins(
    caller, operator, tally, monkeypatch
):
    """The batch's entries are claimed at once, but each call only when its turn comes:
    a cancel that lands in between (here: while the first call is re-checked) wins."""
    first, second, third = approved(caller, operator, tally, "c0", "c1", "c2")
    claimer = worker.build_worker("batcher", batch=True, interval=0)
    batch = claimer.claim_many(claimer.claim_batch)
    assert len(batch) == 3
    checks = runner.check_call

    def cancel_the_second_meanwhile(call: runner.Call, *known: int | None) -> int:
        if call.run_id == "run-c0":
            decisions.cancel(second.pk, by="the agent", user=None)
        return checks(call, *known)

    monkeypatch.setattr(runner, "check_call", cancel_the_second_meanwhile)

    claimer.run_entries(batch)

    assert (tally.count("c0"), tally.count("c1"), tally.count("c2")) == (1, 0, 1)
    second.refresh_from_db()
    assert second.status == ApprovalStatus.CANCELLED
    assert record_of(second).status == "cancelled"
    types = event_types(caller.tenant, "run-c1")
    assert types.count("tool_call_result") == 1 and "tool_call_start" in types
    assert queue_entries(second)[0].return_value == ApprovalStatus.CANCELLED
    for approval in (first, third):
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED


def test_the_calls_of_a_worker_killed_holding_its_batch_are_enqueued_again_after_the_lease(
    caller, operator, tally
):
    """A dead worker's claimed entries stay RUNNING; within the lease its calls are taken
    to be on their way, after it (long before ORPHAN_AFTER) they are enqueued again and
    run once each."""
    held = approved(caller, operator, tally, "k0", "k1", "k2")
    dead = worker.build_worker("dead-worker", batch=True, interval=0)
    assert len(dead.claim_many(dead.claim_batch)) == 3  # then it is killed

    drain_queue()
    assert tasks.sweep()["requeued"] == 0  # within the lease: the worker may be running them
    assert [tally.count(token) for token in ("k0", "k1", "k2")] == [0, 0, 0]

    past_lease = timezone.now() - tasks.LEASE - timedelta(seconds=1)
    assert past_lease > timezone.now() - tasks.ORPHAN_AFTER
    DBTaskResult.objects.filter(status="RUNNING").update(started_at=past_lease)
    ApprovalRequest.objects.filter(pk__in=[a.pk for a in held]).update(decided_at=past_lease)
    assert tasks.sweep()["requeued"] == 3
    assert tasks.sweep()["requeued"] == 0  # ready entries exist now: not enqueued twice

    drain_queue()

    assert [tally.count(token) for token in ("k0", "k1", "k2")] == [1, 1, 1]
    for approval in held:
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED
        types = event_types(caller.tenant, f"run-{approval.run_id[4:]}")
        assert types.count("tool_call_start") == 1 and types.count("tool_call_result") == 1
    assert tasks.sweep()["requeued"] == 0


def test_a_live_worker_slower_than_the_lease_still_runs_each_call_once(caller, operator, tally):
    """The lease may run out while a worker is only slow: the call is enqueued again,
    and of the two entries exactly one runs it (the call's own claim decides)."""
    (approval,) = approved(caller, operator, tally, "slow")
    slow = worker.build_worker("slow-worker", batch=True, interval=0)
    batch = slow.claim_many(slow.claim_batch)
    past_lease = timezone.now() - tasks.LEASE - timedelta(seconds=1)
    DBTaskResult.objects.filter(status="RUNNING").update(started_at=past_lease)
    ApprovalRequest.objects.filter(pk=approval.pk).update(decided_at=past_lease)
    assert tasks.sweep()["requeued"] == 1
    drain_queue("the-other-worker")

    slow.run_entries(batch)  # the slow worker gets to its batch at last

    assert tally.count("slow") == 1
    assert event_types(caller.tenant, "run-slow").count("tool_call_start") == 1
    assert sorted(entry.return_value for entry in queue_entries(approval)) == [
        "succeeded",
        "succeeded",
    ]


def test_a_batch_costs_fewer_statements_per_call_than_one_entry_at_a_time(caller, operator, tally):
    """Issue 13: the approvals are read in one query and the approvals' and entries'
    outcomes written in one statement each for the whole batch; no savepoint."""
    approved(caller, operator, tally, "s0", "s1", "s2", "s3", "s4", "s5")
    single = worker.build_worker("single", batch=True, interval=0, claim_batch=1)
    with CaptureQueriesContext(connection) as one_by_one:
        for _ in range(3):
            assert single.run_next() is not None
    batched = worker.build_worker("batched", batch=True, interval=0, claim_batch=3)
    with CaptureQueriesContext(connection) as in_a_batch:
        assert batched.run_next() is not None

    assert all(tally.count(f"s{n}") == 1 for n in range(6))
    saved = len(one_by_one.captured_queries) - len(in_a_batch.captured_queries)
    # Per call after the first: the claim, the approval's read, its outcome, the entry's.
    assert saved >= 2 * 4, (len(one_by_one.captured_queries), len(in_a_batch.captured_queries))
    # A call's claim and its start are one transaction, without a savepoint inside it.
    assert not [q["sql"] for q in in_a_batch.captured_queries if "SAVEPOINT" in q["sql"]]


def test_a_worker_asked_to_stop_finishes_its_call_and_puts_the_rest_of_its_batch_back(
    caller, operator, tally, monkeypatch
):
    """SIGTERM mid-batch: the worker counts as running a task (so django-tasks' handler
    does not exit on the spot), finishes the call it is on, and its other entries go
    back to READY for another worker instead of waiting for the lease."""
    held = approved(caller, operator, tally, "t0", "t1", "t2")
    stopping = worker.build_worker("stopping", batch=True, interval=0)
    batch = stopping.claim_many(stopping.claim_batch)
    seen: list[bool] = []
    checks = runner.check_call

    def asked_to_stop_meanwhile(call: runner.Call, *known: int | None) -> int:
        seen.append(stopping.running_task)
        stopping.running = False  # what shutdown() does while a task runs
        return checks(call, *known)

    monkeypatch.setattr(runner, "check_call", asked_to_stop_meanwhile)
    wake.work_committed.clear()

    stopping.run_entries(batch)

    assert wake.work_committed.is_set()  # the other workers look now, not at their poll

    assert [tally.count(token) for token in ("t0", "t1", "t2")] == [1, 0, 0]
    assert seen == [True]
    assert [entry.status for entry in queue_entries(held[0])] == ["SUCCESSFUL"]
    for approval in held[1:]:
        assert [entry.status for entry in queue_entries(approval)] == ["READY"]
    monkeypatch.setattr(runner, "check_call", checks)

    drain_queue("another-worker")

    assert [tally.count(token) for token in ("t0", "t1", "t2")] == [1, 1, 1]
    for approval in held:
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED


def test_a_slow_call_hands_the_rest_of_its_batch_to_other_workers_at_once(
    caller, operator, tally, monkeypatch
):
    """A batch runs its calls one after another: a call still running after QUICK_S puts
    the batch's later entries back to READY, so another worker runs them meanwhile
    instead of after the slow one (or after tasks.LEASE)."""
    release = threading.Event()
    run_tool = runner._run_tool

    def slow_for_one(execute_fn, params, ctx, caps, *rest):
        if getattr(params, "token", "") == "slow":
            assert release.wait(10), "the test never let the slow call end"
        return run_tool(execute_fn, params, ctx, caps, *rest)

    monkeypatch.setattr(runner, "_run_tool", slow_for_one)
    held = approved(caller, operator, tally, "slow", "q1", "q2")
    first = worker.build_worker("first", batch=True, interval=0)
    batch = first.claim_many(first.claim_batch)
    assert len(batch) == 3
    # in_thread: the worker's connection goes back to the pool when the thread ends.
    holding = threading.Thread(target=in_thread(lambda: first.run_entries(batch)))
    holding.start()
    try:
        second = worker.build_worker("second", batch=True, interval=0)
        deadline = time.monotonic() + 5
        while tally.count("q1") + tally.count("q2") < 2:
            assert time.monotonic() < deadline, "the rest of the batch was never handed on"
            second.run_next()
            time.sleep(0.01)
        assert holding.is_alive() and tally.count("slow") == 0  # still in the slow call
    finally:
        release.set()
        holding.join(10)
        connection.close()  # this thread's, before the database is flushed

    assert [tally.count(token) for token in ("slow", "q1", "q2")] == [1, 1, 1]
    for approval in held:
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.SUCCEEDED
        # One entry per call, ended once, by the worker that ran it.
        (entry,) = queue_entries(approval)
        assert entry.status == "SUCCESSFUL"
    assert not DBTaskResult.objects.exclude(status="SUCCESSFUL").exists()


def test_each_calls_end_is_written_in_the_transaction_that_starts_the_next(caller, operator, tally):
    """Issue 13: a batch of N calls commits N + 1 times for its calls, not 2N; the events
    of calls sharing a run keep their order (start, result, start, result)."""
    held = [
        hold(caller, TALLY, args=tally.args(token), runId="run-shared")[1]
        for token in ("c0", "c1", "c2")
    ]
    drain_queue()
    for approval in held:
        decisions.decide(approval.pk, operator, "approve")
    commits = []
    original = connection.commit

    def counted() -> None:
        commits.append(1)
        original()

    connection.commit = counted
    try:
        with CaptureQueriesContext(connection) as sent:
            outcomes = tasks.run_approved_calls([str(a.pk) for a in held])
    finally:
        del connection.commit
    assert list(outcomes.values()) == ["succeeded"] * 3
    # On PostgreSQL a start is one statement, its own transaction (apps.invocations.combined),
    # and so is the batch's last end (Closing.flush).
    single = [q for q in sent.captured_queries if q["sql"].startswith("WITH claimed")]
    assert len(single) == (3 + 1 if connection.vendor == "postgresql" else 0)
    # Three starts (the second and third with the end before them) and the last end.
    assert len(commits) + len(single) == 3 + 1, commits
    seen = events(caller.tenant, "run-shared")
    calls = [e for e in seen if e["type"] in ("tool_call_start", "tool_call_result")]
    assert [e["type"] for e in calls] == ["tool_call_start", "tool_call_result"] * 3
    assert [e["toolCallId"] for e in calls] == [a.tool_call_id for a in held for _ in range(2)]
    numbers = [e["seq"] for e in seen]
    assert numbers == sorted(numbers) == list(range(numbers[0], numbers[0] + len(numbers)))
    for approval in held:
        record = record_of(approval)
        assert record.status == "succeeded" and record.ended_at is not None


def test_a_call_whose_next_call_fails_to_start_still_has_its_end_written(
    caller, operator, tally, monkeypatch
):
    """The end of call 1 rides on call 2's start transaction: when that transaction fails,
    the end is not lost with it but written on its own before the error goes on."""
    held = approved(caller, operator, tally, "f0", "f1")
    real = tasks._claimer

    def claimer(approval):
        if approval.pk == held[1].pk:

            def broken() -> bool:
                raise RuntimeError("the database went away")

            return broken
        return real(approval)

    monkeypatch.setattr(tasks, "_claimer", claimer)
    with pytest.raises(RuntimeError, match="went away"):
        tasks.run_approved_calls([str(a.pk) for a in held])

    first = record_of(held[0])
    assert first.status == "succeeded" and first.ended_at is not None
    assert event_types(caller.tenant, "run-f0").count("tool_call_result") == 1
    assert tally.count("f1") == 0
    held[1].refresh_from_db()
    assert held[1].status == ApprovalStatus.APPROVED  # rolled back: a later worker runs it
    assert record_of(held[1]).ended_at is None


def test_a_batch_reads_its_records_not_its_requesters_and_each_call_takes_them_at_its_epoch(
    caller, operator, tally
):
    """Issue 13: the batch's read joins the records, not the tenants and users; each call
    takes its tenant and requesting user from the epoch's cache (callers.requester), so a
    batch of one requester's calls reads those rows at most once."""
    approved(caller, operator, tally, "r0", "r1", "r2")
    batched = worker.build_worker("requesters", batch=True, interval=0, claim_batch=3)
    with CaptureQueriesContext(connection) as ran:
        assert batched.run_next() is not None

    assert [tally.count(f"r{n}") for n in range(3)] == [1, 1, 1]
    sqls = [query["sql"] for query in ran.captured_queries]
    tenant_table = connection.ops.quote_name("tenants_tenant")
    user_table = connection.ops.quote_name("auth_user")
    (read,) = [
        sql
        for sql in sqls
        if "FROM " + connection.ops.quote_name("approvals_approvalrequest") in sql
        and sql.lstrip().upper().startswith("SELECT")
    ]
    assert connection.ops.quote_name("invocations_invocationrecord") in read
    assert tenant_table not in read and user_table not in read
    assert len([sql for sql in sqls if f"FROM {tenant_table}" in sql]) <= 1
    assert len([sql for sql in sqls if f"FROM {user_table}" in sql]) <= 1


def test_a_requester_edited_after_the_batch_was_read_is_seen_by_its_next_call(
    caller, operator, tally, monkeypatch
):
    """The requester's rows come from a cache kept under the authorization epoch: a user
    deactivated while the worker runs its batch is refused on the batch's next call."""
    approved(caller, operator, tally, "e0", "e1")
    requester = ApprovalRequest.objects.get(run_id="run-e0").requested_by
    real_run = runner.run_started

    def deactivate_after_first(call):
        record = real_run(call)
        if call.run_id == "run-e0":
            requester.is_active = False
            requester.save(update_fields=["is_active"])  # changes the epoch
        return record

    batched = worker.build_worker("edited", batch=True, interval=0, claim_batch=2)
    monkeypatch.setattr(runner, "run_started", deactivate_after_first)
    assert batched.run_next() is not None

    assert (tally.count("e0"), tally.count("e1")) == (1, 0)
    second = ApprovalRequest.objects.get(run_id="run-e1")
    assert second.status == ApprovalStatus.FAILED
    assert record_of(second).error_code == "authz_denied"
