"""The approval state machine and its queue live in the database: they survive a
restart, a worker that dies holding an entry, and real worker processes coming and
going; the sweeper expires overdue requests and re-enqueues lost ones."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from django_tasks_db.utils import exclusive_transaction

from apps.approvals import decisions, tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from tests.approvals.support import (
    CONFIRM,
    TALLY,
    drain_queue,
    event_types,
    events,
    hold,
    queue_entries,
    record_of,
)
from tests.support.server import ROOT, database_url
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ---------------------------------------------------------------- restart


def test_an_approval_and_its_queue_entry_survive_a_restart(caller, operator, tally):
    _, approval = hold(caller, TALLY, args=tally.args("restart"), runId="run-restart")
    decisions.decide(approval.pk, operator, "approve")
    # "Restart": nothing in this process's memory is used below; a fresh connection in
    # another thread must see the approval and its queue entry.
    seen: dict[str, object] = {}

    def look() -> None:
        seen["status"] = ApprovalRequest.objects.get(pk=approval.pk).status
        seen["entries"] = [entry.status for entry in queue_entries(approval)]

    start_thread(look).join(timeout=10)
    assert seen == {"status": ApprovalStatus.APPROVED, "entries": ["READY"]}
    assert tally.count("restart") == 0

    drain_queue("a-new-worker")

    assert tally.count("restart") == 1
    assert record_of(approval).status == "succeeded"
    drain_queue("another-worker")
    assert tally.count("restart") == 1
    assert event_types(caller.tenant, "run-restart").count("tool_call_start") == 1


# ---------------------------------------------------------------- a worker that died


def claim_like_a_dying_worker(approval: ApprovalRequest) -> DBTaskResult:
    """Claim the call's queue entry as a worker does, then never run it."""
    with exclusive_transaction():
        entry = (
            DBTaskResult.objects.ready()
            .filter(task_path=tasks.run_approved_call.module_path)
            .get_locked()
        )
        assert entry is not None and entry.args_kwargs["args"] == [str(approval.pk)]
        entry.claim("dead-worker")
    return entry


def test_a_call_whose_worker_died_after_claiming_it_is_re_enqueued_and_runs_once(
    caller, operator, tally
):
    _, approval = hold(caller, TALLY, args=tally.args("orphan"), runId="run-orphan")
    decisions.decide(approval.pk, operator, "approve")
    claim_like_a_dying_worker(approval)

    drain_queue()  # the entry is claimed: nothing picks it up
    assert tally.count("orphan") == 0
    assert tasks.sweep()["requeued"] == 0  # not orphaned yet: the worker may be slow
    assert len(queue_entries(approval)) == 1

    ApprovalRequest.objects.filter(pk=approval.pk).update(
        decided_at=timezone.now() - tasks.ORPHAN_AFTER - timedelta(seconds=1)
    )
    assert tasks.sweep() == {"expired": 0, "requeued": 1, "settled": 0}
    assert tasks.sweep()["requeued"] == 0  # a ready entry exists now: not enqueued twice

    drain_queue()

    assert tally.count("orphan") == 1
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.SUCCEEDED
    assert tasks.sweep()["requeued"] == 0
    drain_queue()
    assert tally.count("orphan") == 1
    assert event_types(caller.tenant, "run-orphan").count("tool_call_start") == 1


# ---------------------------------------------------------------- expiry by the sweeper


def test_the_sweeper_expires_overdue_requests_and_they_never_run(caller, operator, tally):
    _, overdue = hold(caller, TALLY, args=tally.args("late"), runId="run-late")
    _, fresh = hold(caller, CONFIRM, runId="run-fresh")
    ApprovalRequest.objects.filter(pk=overdue.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )

    assert tasks.sweep() == {"expired": 1, "requeued": 0, "settled": 0}

    overdue.refresh_from_db()
    assert overdue.status == ApprovalStatus.EXPIRED
    record = record_of(overdue)
    assert (record.status, record.error_code, record.ok) == ("failed", "approval_expired", False)
    stream = events(caller.tenant, "run-late")
    decided = [e for e in stream if e["type"] == "approval_decided"]
    assert [(e["decision"], e["approvalId"]) for e in decided] == [("expire", str(overdue.pk))]
    assert stream[-1]["type"] == "tool_call_result"
    assert stream[-1]["errorCode"] == "approval_expired"
    fresh.refresh_from_db()
    assert fresh.status == ApprovalStatus.PENDING
    with pytest.raises(decisions.AlreadyDecided):
        decisions.decide(overdue.pk, operator, "approve")
    drain_queue()
    assert tally.count("late") == 0
    assert tasks.sweep() == {"expired": 0, "requeued": 0, "settled": 0}


# ---------------------------------------------------------------- real worker processes


@contextmanager
def worker_process(name: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools,tests.approvals.tools",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
    }
    with log.open("ab") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "toolhub_worker",
                "--interval",
                "0.1",
                "--worker-id",
                name,
            ],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_real_worker_processes_run_each_approved_call_once_across_a_kill(
    caller, operator, tally, tmp_path
):
    log = tmp_path / "worker.log"
    _, first = hold(caller, TALLY, args=tally.args("first"), runId="run-first")
    _, second = hold(caller, TALLY, args=tally.args("second"), runId="run-second")

    def finished(approval: ApprovalRequest) -> bool:
        return record_of(approval).status in ("succeeded", "failed", "cancelled")

    try:
        with worker_process("worker-one", log) as one:
            decisions.decide(first.pk, operator, "approve")
            wait_for(lambda: finished(first), what="the first worker to run the first call")
            one.kill()  # no goodbye: SIGKILL
            one.wait(timeout=10)

        decisions.decide(second.pk, operator, "approve")
        time.sleep(1)
        assert record_of(second).status == "queued"  # nobody is there to run it

        with worker_process("worker-two", log):
            wait_for(lambda: finished(second), what="the second worker to run the second call")
            time.sleep(0.5)  # let it poll again: nothing more may run
    except AssertionError:
        sys.stderr.write(log.read_text(errors="replace"))
        raise

    assert record_of(first).status == "succeeded"
    assert record_of(second).status == "succeeded"
    assert (tally.count("first"), tally.count("second")) == (1, 1)
    for run_id in ("run-first", "run-second"):
        assert event_types(caller.tenant, run_id).count("tool_call_start") == 1
    # Every queue entry of these calls was claimed by exactly one worker. (The first
    # one's entry may still say RUNNING: the kill can land between the call finishing
    # and the worker writing the entry's outcome; the sweeper leaves finished calls be.)
    worker_of = {
        entry.args_kwargs["args"][0]: entry.worker_ids
        for entry in DBTaskResult.objects.filter(task_path=tasks.run_approved_call.module_path)
    }
    assert worker_of == {str(first.pk): ["worker-one"], str(second.pk): ["worker-two"]}
    assert tasks.sweep()["requeued"] == 0


def test_a_call_whose_worker_died_while_running_it_is_settled_not_rerun(caller, operator):
    """A claimed call (executing) is never run again by the sweeper; once its time is
    past it ends as failed."""
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "approve")
    approval.refresh_from_db()
    approval.status = ApprovalStatus.EXECUTING
    approval.claimed_at = timezone.now()
    approval.save()
    assert tasks.settle_interrupted() == 0  # a live worker may still be running it
    approval.claimed_at = timezone.now() - timedelta(minutes=5)
    approval.save()
    assert tasks.settle_interrupted() == 1
    approval.refresh_from_db()
    record = approval.invocation
    record.refresh_from_db()
    assert approval.status == ApprovalStatus.FAILED
    assert record.status == "failed"
    assert record.error_code == "execution"
    assert "not retried" in record.safe_message


def test_a_plain_call_left_running_by_a_dead_process_is_ended_by_the_sweeper(caller):
    """A call that was never held has no approval to track it: once past its timeout by
    a margin, the sweeper ends it as failed instead of leaving it `running` forever."""
    from apps.invocations.models import InvocationRecord, Status

    response = caller.invoke("test__echo", args={"text": "hi"}, runId="run-dead")
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    InvocationRecord.objects.filter(pk=record.pk).update(
        status=Status.RUNNING, ok=None, ended_at=None, started_at=timezone.now()
    )
    assert tasks.sweep()["settled"] == 0  # within its timeout: a live process may own it
    InvocationRecord.objects.filter(pk=record.pk).update(
        started_at=timezone.now() - timedelta(minutes=10)
    )
    assert tasks.sweep()["settled"] == 1
    record.refresh_from_db()
    assert record.status == Status.FAILED
    assert record.error_code == "execution"
    assert events(caller.tenant, "run-dead")[-1]["type"] == "tool_call_result"
