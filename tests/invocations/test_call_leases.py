"""Call leases (issue 47, apps/invocations/leases.py): a running call's process renews its
lease; a call whose lease ran out is settled with its result event, `unavailable` if it
never reached its tool, else `execution`; a same-key retry answers at once once the lease
is overdue, or settles the call and runs it again once it ran out.

The processes that die are in tests/faults/test_call_leases.py (PostgreSQL); here a dead
process's call is a record left `running` with a lease nobody renews, and a paused one's is
a call settled while its tool runs."""

from __future__ import annotations

import math
import queue
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.approvals.tasks import sweep
from apps.invocations import leases, runner
from apps.invocations.models import InvocationRecord, RunEvent, Status
from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import Agent, allow
from tests.support import limited_tools
from tests.support.ledger import stuck_call
from tests.support.limited_tools import GATE, GATED
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = "test__counted_wait"
SLEEP = "test__sleep"
ARGS = {"seconds": 0.1}


@pytest.fixture
def tester(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, *test_tools, name="test tools")
    return agent


def ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


def result_events(record: InvocationRecord) -> list[dict[str, Any]]:
    return [
        event.message
        for event in RunEvent.objects.filter(
            tenant=record.tenant, run_id=record.run_id, tool_call_id=record.tool_call_id
        )
        if event.type == "tool_call_result"
    ]


def test_a_running_call_holds_a_lease_its_process_renews_and_lets_go_when_it_ends(tester, tmp_path):
    trace = tmp_path / "trace.log"
    answers: queue.Queue[Any] = queue.Queue()
    body = {"args": {"path": str(trace), "token": "t", "ms": 600}, "idempotencyKey": "held-1"}
    start_thread(lambda: answers.put(tester.invoke(SLOW, **body)))
    while (record := InvocationRecord.objects.filter(idempotency_key="held-1").first()) is None:
        time.sleep(0.02)

    assert record.status == Status.RUNNING
    assert record.lease_expires_at is not None
    assert record.lease_expires_at > timezone.now()
    assert record.pk in leases.keeper.held()

    assert answers.get(timeout=30).status_code == 200
    assert record.pk not in leases.keeper.held()


def test_renewing_every_call_of_a_process_is_one_statement_and_skips_ended_calls(tester):
    records = [
        stuck_call(
            tester.tenant,
            tester.principal,
            SLEEP,
            ARGS,
            f"renew-{n}",
            lease_expires_at=ago(-1),
            tool_call_id=f"call-{n}",
        )
        for n in range(20)
    ]
    ended = records[0]
    InvocationRecord.objects.filter(pk=ended.pk).update(
        status=Status.SUCCEEDED, ended_at=timezone.now(), ok=True
    )

    with CaptureQueriesContext(connection) as queries:
        renewed = leases.renew([record.pk for record in records])

    assert len(queries) == 1
    assert renewed == 19
    for record in records[1:]:
        record.refresh_from_db()
        assert record.lease_expires_at > timezone.now() + timedelta(seconds=leases.lease_s() - 2)
    ended.refresh_from_db()
    assert ended.lease_expires_at < timezone.now() + timedelta(seconds=2)


def test_a_same_key_retry_of_a_call_whose_lease_is_overdue_answers_at_once_with_its_time_left(
    tester,
):
    """Not renewed for longer than two renewals: its process is taken to have stopped.
    The retry does not wait for it (the call has 3 s left on its lease, its tool 0.5 s
    of timeout: waiting would have taken 3.5 s); it says when to come back."""
    expiry = timezone.now() + timedelta(seconds=3)
    stuck = stuck_call(
        tester.tenant, tester.principal, SLEEP, ARGS, "overdue-1", lease_expires_at=expiry
    )
    assert not leases.fresh(stuck)

    retry = tester.invoke(SLEEP, args=ARGS, idempotencyKey="overdue-1")

    assert retry.status_code == 409, retry.content
    body = retry.json()
    assert body["invocationId"] == str(stuck.pk)
    assert body["status"] == "running"
    assert 0 < body["retryAfterMs"] <= 3000
    assert retry["Retry-After"] == str(math.ceil(body["retryAfterMs"] / 1000))
    stuck.refresh_from_db()
    assert stuck.status == Status.RUNNING
    assert stuck.retry_after_ms is None  # the hint is the answer's, never saved


def test_a_same_key_retry_after_the_lease_ran_out_settles_the_call_and_runs_again(tester):
    stuck = stuck_call(
        tester.tenant, tester.principal, SLEEP, ARGS, "expired-1", lease_expires_at=ago(1)
    )

    retry = tester.invoke(SLEEP, args=ARGS, idempotencyKey="expired-1")

    assert retry.status_code == 200, retry.content
    assert retry.json()["ok"] is True
    assert retry.json()["retryOf"] == str(stuck.pk)
    assert retry.json()["attempt"] == 2
    stuck.refresh_from_db()
    assert stuck.status == Status.FAILED
    assert stuck.error_code == "execution"
    assert stuck.safe_message == leases.MAY_HAVE_RUN
    assert [event["errorCode"] for event in result_events(stuck)] == ["execution"]


def test_the_sweeper_settles_expired_leases_by_whether_the_tool_had_the_call(tester):
    may_have_run = stuck_call(
        tester.tenant,
        tester.principal,
        SLEEP,
        ARGS,
        "sweep-1",
        lease_expires_at=ago(1),
        tool_call_id="call-1",
    )
    never_ran = stuck_call(
        tester.tenant,
        tester.principal,
        SLEEP,
        {"seconds": 0.2},
        "sweep-2",
        lease_expires_at=ago(1),
        tool_pending=True,
        tool_call_id="call-2",
    )
    alive = stuck_call(
        tester.tenant,
        tester.principal,
        SLEEP,
        {"seconds": 0.3},
        "sweep-3",
        lease_expires_at=ago(-5),
        tool_call_id="call-3",
    )
    no_lease = stuck_call(
        tester.tenant, tester.principal, SLEEP, {"seconds": 0.4}, "sweep-4", tool_call_id="call-4"
    )

    assert sweep()["settled"] == 2

    for record in (may_have_run, never_ran, alive, no_lease):
        record.refresh_from_db()
    assert (may_have_run.status, may_have_run.error_code) == (Status.FAILED, "execution")
    assert may_have_run.retry_after_ms is None
    assert (never_ran.status, never_ran.error_code) == (Status.FAILED, "unavailable")
    assert never_ran.safe_message == leases.NEVER_RAN
    assert never_ran.retry_after_ms == 0
    assert never_ran.receipt
    [event] = result_events(never_ran)
    assert (event["errorCode"], event["retryAfterMs"]) == ("unavailable", 0)
    assert alive.status == Status.RUNNING
    assert no_lease.status == Status.RUNNING  # the timeout rule's, later
    assert runner.settle_lapsed_calls() == 0  # settled once


def test_a_same_key_retry_of_a_call_that_never_ran_runs_it(tester):
    stuck = stuck_call(
        tester.tenant,
        tester.principal,
        SLEEP,
        ARGS,
        "pending-1",
        lease_expires_at=ago(1),
        tool_pending=True,
    )
    assert runner.settle_lapsed_calls() == 1

    retry = tester.invoke(SLEEP, args=ARGS, idempotencyKey="pending-1")

    assert retry.status_code == 200, retry.content
    assert retry.json()["ok"] is True
    assert retry.json()["retryOf"] == str(stuck.pk)


def test_a_held_call_whose_worker_stopped_renewing_fails_with_its_approval(tester):
    tool = Tool.objects.get(pk=SLEEP)
    tool.requires_confirmation = True
    tool.save()
    held = tester.invoke(SLEEP, args=ARGS, idempotencyKey="worker-1")
    assert held.status_code == 202, held.content
    approval = ApprovalRequest.objects.get(pk=held.json()["approvalId"])
    # As a worker writes its claim and start (approved -> executing), then dies.
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalStatus.EXECUTING, claimed_at=timezone.now()
    )
    InvocationRecord.objects.filter(pk=approval.invocation_id).update(
        status=Status.RUNNING, started_at=timezone.now(), lease_expires_at=ago(1)
    )

    assert runner.settle_lapsed_calls() == 1

    approval.refresh_from_db()
    record = InvocationRecord.objects.get(pk=approval.invocation_id)
    assert approval.status == ApprovalStatus.FAILED
    assert (record.status, record.error_code) == (Status.FAILED, "execution")
    assert [event["errorCode"] for event in result_events(record)] == ["execution"]


def test_a_call_whose_lease_is_renewed_while_it_runs_past_it_is_not_settled(
    tester, tmp_path, settings
):
    """A 1 s lease, renewed every 0.2 s, on a call of 3 s: swept all along, never
    settled."""
    settings.TOOLHUB_CALL_LEASE_MS = 1000
    trace = tmp_path / "trace.log"
    answers: queue.Queue[Any] = queue.Queue()
    body = {"args": {"path": str(trace), "token": "t", "ms": 3000}, "idempotencyKey": "long-1"}
    start_thread(lambda: answers.put(tester.invoke(SLOW, **body)))
    settled = 0
    while answers.empty():
        settled += runner.settle_lapsed_calls()
        time.sleep(0.05)

    answer = answers.get()
    assert answer.status_code == 200, answer.content
    assert answer.json()["ok"] is True
    assert settled == 0
    record = InvocationRecord.objects.get(pk=answer.json()["invocationId"])
    assert record.lease_expires_at > record.started_at + timedelta(seconds=2)  # renewed


@pytest.fixture
def limited(tester: Agent, settings: Any) -> Iterator[Agent]:
    for contract in limited_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
    Tool.objects.sync_registry(registry)
    allow(tester.tenant, *(c.id for c in limited_tools.CONTRACTS), name="limits")
    settings.TOOLHUB_CONCURRENCY_WAIT_S = 20
    GATE.reset()
    yield tester
    GATE.opened.set()
    for contract in limited_tools.CONTRACTS:
        registry.unregister(contract.id)
    Tool.objects.sync_registry(registry)


def test_a_call_waiting_for_a_slot_is_marked_as_not_handed_to_its_tool_until_it_is(limited):
    Tool.objects.filter(pk=GATED).update(max_concurrency=1)
    answers: queue.Queue[Any] = queue.Queue()
    # Keys: a read-only call without one is recorded only once its tool runs (records_late).
    first = {"toolCallId": "first", "idempotencyKey": "first"}
    start_thread(lambda: answers.put(limited.invoke(GATED, **first)))
    assert GATE.entered.acquire(timeout=15)
    start_thread(
        lambda: answers.put(limited.invoke(GATED, toolCallId="second", idempotencyKey="second"))
    )
    while (waiting := InvocationRecord.objects.filter(tool_call_id="second").first()) is None:
        time.sleep(0.02)

    assert waiting.status == Status.RUNNING
    assert waiting.tool_pending is True
    running = InvocationRecord.objects.get(tool_call_id="first")
    assert running.tool_pending is None  # handed to its tool (its record says it may run)

    GATE.opened.set()
    assert [answers.get(timeout=30).status_code for _ in range(2)] == [200, 200]
    waiting.refresh_from_db()
    assert waiting.tool_pending is None


def gone_owner() -> str:
    """The `lease_owner` of a process of this host that has since exited."""
    process = subprocess.Popen(["sleep", "30"])
    try:
        started = leases._started(process.pid)
    finally:
        process.kill()
        process.wait()
    assert started
    return f"0/{process.pid}/{started}@{leases.HOST}"


def test_a_same_key_retry_of_a_call_whose_owner_is_gone_settles_it_at_once(tester):
    """Its process exited (on this host: its pid no longer runs it): the retry does not
    wait for the lease (a minute left) but settles the call and answers with it."""
    stuck = stuck_call(
        tester.tenant, tester.principal, SLEEP, ARGS, "gone-1", lease_expires_at=ago(-60)
    )
    InvocationRecord.objects.filter(pk=stuck.pk).update(lease_owner=gone_owner())
    stuck.refresh_from_db()
    assert leases.fresh(stuck) and leases.owner_dead(stuck)

    retry = tester.invoke(SLEEP, args=ARGS, idempotencyKey="gone-1")

    assert retry.status_code == 200, retry.content
    body = retry.json()
    assert (body["invocationId"], body["ok"], body["errorCode"]) == (
        str(stuck.pk),
        False,
        "execution",
    )
    stuck.refresh_from_db()
    assert (stuck.status, stuck.safe_message) == (Status.FAILED, leases.MAY_HAVE_RUN)
    assert stuck.ended_at < stuck.lease_expires_at  # before its lease ran out
    assert [event["errorCode"] for event in result_events(stuck)] == ["execution"]

    again = tester.invoke(SLEEP, args=ARGS, idempotencyKey="gone-1")  # runs it now
    assert (again.json()["ok"], again.json()["retryOf"]) == (True, str(stuck.pk))


def test_an_owner_alive_or_unknown_is_not_taken_for_dead(tester):
    stuck = stuck_call(
        tester.tenant, tester.principal, SLEEP, ARGS, "alive-1", lease_expires_at=ago(-60)
    )
    process = subprocess.Popen(["sleep", "30"])
    try:
        alive = f"0/{process.pid}/{leases._started(process.pid)}@{leases.HOST}"
        for owner in (alive, leases.owner(), "0/1/1@another-host", "nonsense", None):
            stuck.lease_owner = owner
            assert not leases.owner_dead(stuck), owner
    finally:
        process.kill()
        process.wait()


def test_a_workers_approved_call_that_never_reached_its_tool_is_queued_again(tester):
    """Its worker died while the call waited for a slot: the approval is `approved` again,
    the record `queued`, with a queue entry, at most REOFFERS times; then it fails as any
    call that never ran."""
    from django_tasks_db.models import DBTaskResult

    from apps.approvals import tasks

    tool = Tool.objects.get(pk=SLEEP)
    tool.requires_confirmation = True
    tool.save()
    held = tester.invoke(SLEEP, args=ARGS)
    assert held.status_code == 202, held.content
    approval = ApprovalRequest.objects.get(pk=held.json()["approvalId"])
    entries = DBTaskResult.objects.filter(task_path=tasks.run_approved_call.module_path)

    def started_then_died() -> None:  # a worker's claim and start, then nothing
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            status=ApprovalStatus.EXECUTING, claimed_at=timezone.now()
        )
        InvocationRecord.objects.filter(pk=approval.invocation_id).update(
            status=Status.RUNNING,
            started_at=timezone.now(),
            lease_expires_at=ago(1),
            tool_pending=True,
        )

    for times in range(1, tasks.REOFFERS + 1):
        entries.delete()
        started_then_died()
        assert runner.settle_lapsed_calls() == 1
        approval.refresh_from_db()
        record = InvocationRecord.objects.get(pk=approval.invocation_id)
        assert (approval.status, approval.reoffered) == (ApprovalStatus.APPROVED, times)
        assert (record.status, record.started_at, record.lease_expires_at) == (
            Status.QUEUED,
            None,
            None,
        )
        assert [entry.args_kwargs["args"] for entry in entries] == [[str(approval.pk)]]
        assert result_events(record) == []

    started_then_died()
    assert runner.settle_lapsed_calls() == 1
    approval.refresh_from_db()
    record = InvocationRecord.objects.get(pk=approval.invocation_id)
    assert approval.status == ApprovalStatus.FAILED
    assert (record.status, record.error_code) == (Status.FAILED, "unavailable")


def test_on_postgresql_an_owner_elsewhere_is_dead_once_its_liveness_lock_is_free(tester):
    """Another host's process (its pid means nothing here): alive while a connection
    holds its advisory lock, dead the moment that connection is gone."""
    if connection.vendor != "postgresql":
        pytest.skip("the liveness lock is PostgreSQL's (SQLite: one host, its pids)")
    import psycopg

    stuck = stuck_call(
        tester.tenant, tester.principal, SLEEP, ARGS, "elsewhere-1", lease_expires_at=ago(-60)
    )
    key = 4242424242
    stuck.lease_owner = f"{key}/1/1@another-host"
    holder = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", (key,))
        assert not leases.owner_dead(stuck)
        assert not leases.owner_dead(stuck)  # the look takes nothing it keeps
    finally:
        holder.close()
    deadline = time.monotonic() + 10  # its backend ends a moment after the socket closes
    while not leases.owner_dead(stuck):
        assert time.monotonic() < deadline, "the lock outlived its connection"
        time.sleep(0.01)
    assert not leases.owner().startswith("0/")  # this process holds a lock of its own


def test_a_call_settled_while_it_ran_does_not_write_its_late_end(limited, caplog):
    """As a process paused past its lease finds it when it resumes: the call was settled
    meanwhile. Its end writes neither over the settled record nor a second result event;
    what it knew is logged, and its own answer is the settled record."""
    answers: queue.Queue[Any] = queue.Queue()
    start_thread(lambda: answers.put(limited.invoke(GATED, args={}, idempotencyKey="late-1")))
    assert GATE.entered.acquire(timeout=20)  # its tool has it
    record = InvocationRecord.objects.get(idempotency_key="late-1")
    with transaction.atomic():  # its lease ran out (the renewal waits for this)
        InvocationRecord.objects.filter(pk=record.pk).update(lease_expires_at=ago(1))
        assert runner.settle_lapsed(record) is not None
    GATE.opened.set()

    answer = answers.get(timeout=30)
    body = answer.json()
    assert (body["invocationId"], body["ok"], body["errorCode"]) == (
        str(record.pk),
        False,
        "execution",
    )
    settled = InvocationRecord.objects.get(pk=record.pk)
    assert (settled.status, settled.error_code, settled.result) == (
        Status.FAILED,
        "execution",
        None,
    )
    assert settled.safe_message == leases.MAY_HAVE_RUN
    assert [event["errorCode"] for event in result_events(settled)] == ["execution"]
    assert f"late end of call {record.pk}" in caplog.text
    assert "ended status=succeeded" in caplog.text
