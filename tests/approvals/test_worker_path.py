"""The worker's path from a decision to the result (issue 14): one statement claims a
queue entry, the approved call is claimed in the transaction that records its start,
the worker keeps its database connection, and a worker process pushes events from one
event loop of its own."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from channels.layers import get_channel_layer
from django.db import connection
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals import decisions, tasks, worker
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations import events as run_events
from apps.invocations import runner
from tests.approvals.support import (
    TALLY,
    drain_queue,
    event_types,
    hold,
    queue_entries,
    record_of,
)
from tests.support.threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_call_cancelled_while_its_worker_rechecks_it_never_runs(
    caller, operator, tally, monkeypatch
):
    """The claim (approved -> executing) comes after the re-checks, in the start's
    transaction: a cancel that lands during the re-checks wins, and nothing runs."""
    _, approval = hold(caller, TALLY, args=tally.args("late-cancel"), runId="run-late-cancel")
    decisions.decide(approval.pk, operator, "approve")
    checks = runner.check_call

    def cancelled_meanwhile(call: runner.Call, *known: int | None) -> int:
        checked_at = checks(call, *known)
        decisions.cancel(approval.pk, by="the agent", user=None)
        return checked_at

    monkeypatch.setattr(runner, "check_call", cancelled_meanwhile)

    assert tasks.run_approved_call.call(str(approval.pk)) == ApprovalStatus.CANCELLED

    assert tally.count("late-cancel") == 0
    record = record_of(approval)
    assert (record.status, record.error_code) == ("cancelled", "cancelled")
    types = event_types(caller.tenant, "run-late-cancel")
    assert types.count("tool_call_start") == 1 and types.count("tool_call_result") == 1


def test_workers_racing_on_one_call_claim_it_once_and_it_starts_in_the_same_commit(
    caller, operator, tally
):
    """Six workers run the task of one approved call at the same moment: it runs once,
    and no one ever sees it executing without its start recorded."""
    _, approval = hold(caller, TALLY, args=tally.args("raced"), runId="run-raced")
    decisions.decide(approval.pk, operator, "approve")
    barrier = threading.Barrier(6)
    outcomes: list[str] = []
    seen: list[tuple[str, str]] = []

    def contender() -> None:
        barrier.wait(timeout=30)
        outcomes.append(tasks.run_approved_call.call(str(approval.pk)))

    def watch() -> None:
        barrier.wait(timeout=30)
        for _ in range(200):
            status = ApprovalRequest.objects.get(pk=approval.pk).status
            seen.append((status, record_of(approval).status))

    threads = [threading.Thread(target=in_thread(contender)) for _ in range(5)]
    threads.append(threading.Thread(target=in_thread(watch)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert tally.count("raced") == 1
    assert sorted(outcomes).count(ApprovalStatus.SUCCEEDED) >= 1 and len(outcomes) == 5
    assert event_types(caller.tenant, "run-raced").count("tool_call_start") == 1
    assert (ApprovalStatus.EXECUTING, "queued") not in seen


def test_a_worker_claims_only_ready_entries_of_its_queues_in_order(caller, operator, tally):
    later = timezone.now() + timedelta(hours=1)
    _, first = hold(caller, TALLY, args=tally.args("first"), runId="run-first")
    _, second = hold(caller, TALLY, args=tally.args("second"), runId="run-second")
    drain_queue()  # the operators' notifications
    tasks.run_approved_call.using(run_after=later).enqueue(str(first.pk))
    elsewhere = tasks.run_approved_call.enqueue(str(first.pk))
    DBTaskResult.objects.filter(pk=elsewhere.id).update(queue_name="elsewhere")
    tasks.run_approved_call.using(priority=5).enqueue(str(second.pk))
    tasks.run_approved_call.enqueue(str(first.pk))
    claimer = worker.build_worker("claimer", batch=True, interval=0)

    claimed = [claimer.claim(), claimer.claim(), claimer.claim()]

    assert [entry.args_kwargs["args"] if entry else None for entry in claimed] == [
        [str(second.pk)],  # the higher priority first
        [str(first.pk)],
        None,  # not before its run_after, and not from another queue
    ]
    assert all(entry.worker_ids == ["claimer"] for entry in claimed if entry)
    assert sorted(entry.status for entry in queue_entries(first)) == [
        "READY",
        "READY",
        "RUNNING",
    ]


def test_the_worker_keeps_its_database_connection_between_entries(caller, operator, tally):
    """A new connection per entry cost milliseconds of every decision's latency."""
    _, first = hold(caller, TALLY, args=tally.args("one"), runId="run-one")
    _, second = hold(caller, TALLY, args=tally.args("two"), runId="run-two")
    drain_queue()
    decisions.decide(first.pk, operator, "approve")
    decisions.decide(second.pk, operator, "approve")
    runner_of_both = worker.build_worker("keeper", batch=True, interval=0, claim_batch=1)

    assert runner_of_both.run_next() is not None
    opened = connection.connection
    assert runner_of_both.run_next() is not None

    assert opened is not None and connection.connection is opened
    assert (tally.count("one"), tally.count("two")) == (1, 1)


def test_a_worker_process_pushes_its_events_from_one_loop_of_its_own(caller):
    """async_to_sync made a new event loop (and Redis connection) per push."""
    before = run_events._server_loop
    layer = get_channel_layer()
    try:
        worker.start_push_loop()
        loop = run_events._server_loop
        assert loop is not None and loop is not before and loop.is_running()
        group = run_events.run_group(caller.tenant.pk, "run-pushed")
        channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), loop).result(timeout=5)
        asyncio.run_coroutine_threadsafe(layer.group_add(group, channel), loop).result(timeout=5)

        caller.invoke("test__echo", args={"text": "hi"}, runId="run-pushed")

        # A quick call's start and result travel as one message (events._push_all).
        message = asyncio.run_coroutine_threadsafe(layer.receive(channel), loop).result(timeout=5)
        received = message["events"]
        assert run_events._server_loop is loop  # still the same loop after the push
    finally:
        run_events._server_loop = before
    assert [event["type"] for event in received] == [
        "tool_call_start",
        "tool_call_result",
    ]
    loop.call_soon_threadsafe(loop.stop)


def test_an_approved_call_whose_tool_was_disabled_while_it_waited_is_refused_not_run(
    caller, operator, tally
):
    """The re-checks stay (the world may change while a call waits): a refusal is recorded,
    in the transaction that claims the call."""
    from apps.tools.models import Tool

    _, approval = hold(caller, TALLY, args=tally.args("disabled"), runId="run-disabled")
    decisions.decide(approval.pk, operator, "approve")
    Tool.objects.filter(pk=TALLY).update(enabled=False)

    drain_queue()

    assert tally.count("disabled") == 0
    record = record_of(approval)
    assert (record.status, record.error_code) == ("failed", "unavailable")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.FAILED and approval.claimed_at is not None
    assert event_types(caller.tenant, "run-disabled")[-2:] == [
        "tool_call_start",
        "tool_call_result",
    ]
