"""Concurrent decisions: the first one wins, every other gets AlreadyDecided / 409, and
the approved call runs at most once however often it is decided, queued or drained."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.approvals import decisions, tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus, Vote
from apps.invocations import events as run_events
from apps.invocations.models import InvocationRecord, Run, RunEvent
from tests.approvals.support import (
    ECHO,
    drain_queue,
    event_types,
    hold,
    logged_in,
    make_operator,
    post_decision,
    queue_entries,
    record_of,
    require_approval,
)
from tests.support.threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)

CONTENDERS = 20
OPERATORS = 5  # so each operator decides four times: "the same operator twice" and more


def race(count: int, attempt: Callable[[int], Any]) -> list[Any]:
    """Run `attempt(i)` in `count` threads released at the same moment; their results."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def contender(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[index] = attempt(index)
        except Exception as exc:  # reported, not swallowed: the test asserts on it
            results[index] = ("error", repr(exc))

    threads = [
        threading.Thread(target=in_thread(functools.partial(contender, i)), daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a contender hung"
    return results


def plan(operators: list[User], mixed: bool) -> list[tuple[User, str]]:
    return [
        (operators[i % len(operators)], "reject" if mixed and i % 3 == 1 else "approve")
        for i in range(CONTENDERS)
    ]


@pytest.fixture
def contested(caller):
    """A pending test__echo call in `acme` and five operators who may decide it."""
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "once"}, runId="run-race")
    operators = [make_operator(f"op{i}", caller.tenant) for i in range(OPERATORS)]
    return approval, operators


def assert_one_winner_and_at_most_one_execution(caller, approval, winners) -> None:
    assert len(winners) == 1, winners
    user_id, decision = winners[0]
    approval.refresh_from_db()
    votes = list(Vote.objects.filter(approval=approval))
    assert [(v.user_id, v.decision) for v in votes] == [(user_id, decision)]
    assert approval.decided_by_id == user_id
    expected = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.REJECTED
    assert approval.status == expected
    assert len(queue_entries(approval)) == (1 if decision == "approve" else 0)

    drain_queue()

    succeeded = InvocationRecord.objects.filter(tool_ref=ECHO, status="succeeded").count()
    assert succeeded == (1 if decision == "approve" else 0)
    types = event_types(caller.tenant, "run-race")
    assert types.count("approval_decided") == 1
    assert types.count("tool_call_start") == 1
    assert types.count("tool_call_result") == 1
    record = record_of(approval)
    if decision == "approve":
        assert (record.status, record.result) == ("succeeded", {"text": "once"})
    else:
        assert (record.status, record.error_code) == ("failed", "approval_rejected")


@pytest.mark.parametrize("mixed", [True, False], ids=["approve-and-reject", "approve-only"])
def test_twenty_concurrent_decisions_have_exactly_one_winner(caller, contested, mixed):
    approval, operators = contested
    attempts = plan(operators, mixed)

    def attempt(index: int) -> Any:
        user, decision = attempts[index]
        fresh = User.objects.get(pk=user.pk)  # no permission cache shared between threads
        try:
            decisions.decide(approval.pk, fresh, decision, reason=f"contender {index}")
        except decisions.AlreadyDecided:
            return "already decided"
        return ("won", user.pk, decision)

    results = race(CONTENDERS, attempt)

    winners = [(r[1], r[2]) for r in results if isinstance(r, tuple) and r[0] == "won"]
    losers = [r for r in results if r == "already decided"]
    assert len(losers) == CONTENDERS - 1, results
    assert_one_winner_and_at_most_one_execution(caller, approval, winners)


@pytest.mark.parametrize("mixed", [True, False], ids=["approve-and-reject", "approve-only"])
def test_twenty_concurrent_http_decisions_get_one_200_and_nineteen_409(caller, contested, mixed):
    approval, operators = contested
    attempts = [(user, decision, logged_in(user)) for user, decision in plan(operators, mixed)]

    def attempt(index: int) -> Any:
        user, decision, client = attempts[index]
        response = post_decision(client, approval.pk, decision, reason=f"contender {index}")
        return (response.status_code, user.pk, decision)

    results = race(CONTENDERS, attempt)

    codes = sorted(r[0] for r in results if isinstance(r, tuple) and r[0] != "error")
    assert codes == [200] + [409] * (CONTENDERS - 1), results
    winners = [(r[1], r[2]) for r in results if r[0] == 200]
    assert_one_winner_and_at_most_one_execution(caller, approval, winners)


def test_a_cancel_racing_approvals_leaves_one_outcome(caller, contested):
    approval, operators = contested

    def attempt(index: int) -> Any:
        try:
            if index == 0:
                decisions.cancel(approval.pk, by="agent:test", user=None)
                return ("won", None, "cancel")
            user = User.objects.get(pk=operators[index % len(operators)].pk)
            decisions.decide(approval.pk, user, "approve")
            return ("won", user.pk, "approve")
        except decisions.AlreadyDecided:
            return "already decided"

    results = race(10, attempt)

    won = [r[2] for r in results if isinstance(r, tuple) and r[0] == "won"]
    assert all(isinstance(r, tuple) or r == "already decided" for r in results), results
    # At most one approval wins; the cancel wins unless the call already ran (it cannot
    # have: nothing drained yet), so it always ends the call.
    assert sorted(won) in (["cancel"], ["approve", "cancel"]), results
    drain_queue()
    approval.refresh_from_db()
    record = record_of(approval)
    assert approval.status == ApprovalStatus.CANCELLED
    assert (record.status, record.error_code) == ("cancelled", "cancelled")
    assert InvocationRecord.objects.filter(status="succeeded").count() == 0
    assert event_types(caller.tenant, "run-race").count("tool_call_start") == 1


def test_an_approved_call_enqueued_twice_runs_once(caller, operator, tally):
    _, approval = hold(caller, "test__tally", args=tally.args("twice"), runId="run-twice")
    decisions.decide(approval.pk, operator, "approve")
    tasks.run_approved_call.enqueue(str(approval.pk))
    assert len(queue_entries(approval)) == 2

    drain_queue()

    assert tally.count("twice") == 1
    assert event_types(caller.tenant, "run-twice").count("tool_call_start") == 1
    assert sorted(entry.status for entry in queue_entries(approval)) == [
        "SUCCESSFUL",
        "SUCCESSFUL",
    ]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.SUCCEEDED


def test_workers_draining_duplicate_queue_entries_at_once_run_the_call_once(
    caller, operator, tally
):
    _, approval = hold(caller, "test__tally", args=tally.args("dup"), runId="run-dup")
    decisions.decide(approval.pk, operator, "approve")
    for _ in range(3):
        tasks.run_approved_call.enqueue(str(approval.pk))

    race(4, lambda index: drain_queue(f"racer-{index}"))

    assert tally.count("dup") == 1
    assert event_types(caller.tenant, "run-dup").count("tool_call_start") == 1
    assert {entry.status for entry in queue_entries(approval)} == {"SUCCESSFUL"}
    assert record_of(approval).status == "succeeded"


def test_a_decision_does_not_deadlock_with_an_event_emitted_on_the_same_run(caller, operator):
    """The runner emits events on a run (locking its Run row, then inserting a RunEvent
    that references the tenant) while an operator decides a call of the same run (which
    locks the approval, then emits on the run). Neither may fail or wait forever."""
    _, approval = hold(caller, "test__confirm", runId="run-shared")
    tenant = caller.tenant
    assert Run.objects.filter(tenant=tenant, run_id="run-shared").exists()
    run_locked, decider_started = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def emitter() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                Run.objects.next_seq(tenant, "run-shared")  # what events.emit does first
                run_locked.set()
                decider_started.wait(timeout=10)
                time.sleep(0.5)  # the decision now holds its locks and waits for the run
                run_events.emit(
                    tenant, "run-shared", "tool_call_start", tool_call_id="other", tool_id=ECHO
                )
            outcome["emitter"] = "ok"
        except Exception as exc:
            outcome["emitter"] = repr(exc)

    def decider() -> None:
        run_locked.wait(timeout=10)
        decider_started.set()
        try:
            decisions.decide(approval.pk, User.objects.get(pk=operator.pk), "approve")
            outcome["decider"] = "ok"
        except Exception as exc:
            outcome["decider"] = repr(exc)

    threads = [threading.Thread(target=in_thread(f), daemon=True) for f in (emitter, decider)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert outcome == {"emitter": "ok", "decider": "ok"}
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED
    assert RunEvent.objects.filter(run_id="run-shared", tool_call_id="other").count() == 1
