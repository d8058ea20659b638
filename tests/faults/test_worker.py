"""The worker and its sweeper outlive their dependencies' faults: a database that is
down, a worker that died holding queue entries, a record closed without its event."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.utils import OperationalError
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals import decisions, tasks, wake, worker
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations.models import InvocationRecord, RunEvent
from tests.approvals.support import CONFIRM, events, hold, queue_entries
from tests.approvals.test_durability import claim_like_a_dying_worker
from tests.support.processes import stop
from tests.support.server import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_emits_the_missing_result_event_of_a_final_record(caller):
    response = caller.invoke("test__echo", args={"text": "hi"}, runId="run-repair")
    record = InvocationRecord.objects.get(pk=response.json()["invocationId"])
    RunEvent.objects.filter(run_id="run-repair", type="tool_call_result").delete()

    tasks.sweep()
    tasks.sweep()  # and only once

    stream = events(caller.tenant, "run-repair")
    assert [e["type"] for e in stream] == ["tool_call_start", "tool_call_result"]
    result = stream[-1]
    assert result["ok"] is True and result["invocationId"] == str(record.pk)
    assert result["result"] == record.result
    assert result["toolCallId"] == record.tool_call_id


def test_it_ends_a_dead_workers_queue_entry_once_its_call_is_settled(caller, operator):
    _, approval = hold(caller, CONFIRM, runId="run-dead-entry")
    decisions.decide(approval.pk, operator, "approve")
    entry = claim_like_a_dying_worker(approval)
    DBTaskResult.objects.filter(pk=entry.pk).update(
        started_at=timezone.now() - tasks.ORPHAN_AFTER - timedelta(seconds=1)
    )

    tasks.sweep()  # the call is still approved: its worker may yet run it
    assert [e.status for e in queue_entries(approval)] == ["RUNNING"]

    ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalStatus.FAILED)
    tasks.sweep()
    [ended] = queue_entries(approval)
    assert ended.status == "FAILED"
    assert ended.exception_class_path == "apps.approvals.tasks.WorkerDied"


def test_an_enqueue_wakes_the_worker_when_it_commits_not_before(caller, operator):
    _, approval = hold(caller, CONFIRM, runId="run-wake")
    wake.work_committed.clear()
    with transaction.atomic():
        decisions.decide(approval.pk, operator, "approve")
        assert not wake.work_committed.is_set()
    assert wake.work_committed.is_set()


def listening_backend() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s AND pid <> pg_backend_pid()",
            [f"LISTEN {wake.CHANNEL}"],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def test_the_listeners_connection_goes_back_to_the_pool_no_longer_listening():
    """A pooled connection handed to a request must not carry the listener's LISTEN
    (it would queue every enqueue's notification for a backend that never reads them)."""
    if connection.vendor != "postgresql" or "pool" not in connection.settings_dict["OPTIONS"]:
        pytest.skip("the listener runs on PostgreSQL: this runs in the PostgreSQL leg")
    listener = wake.Listener()
    listener.start()
    deadline = time.monotonic() + 10
    while (pid := listening_backend()) is None:
        assert time.monotonic() < deadline, "the listener never listened"
        time.sleep(0.05)
    listener.stop()
    listener.join(timeout=2)  # at once: a stop wakes it, no timeout does
    assert not listener.is_alive()

    pool = connection.pool
    taken = [pool.getconn() for _ in range(pool.get_stats()["pool_available"])]
    try:
        [reused] = [conn for conn in taken if conn.info.backend_pid == pid]
        with reused.cursor() as cursor:
            cursor.execute("SELECT pg_listening_channels()")
            assert cursor.fetchall() == []
    finally:
        for conn in taken:
            pool.putconn(conn)


def only_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the listener runs on PostgreSQL: this runs in the PostgreSQL leg")


def test_an_idle_listener_reads_nothing_until_a_notification_comes(monkeypatch):
    """psycopg's notifies(timeout=) wakes ten times a second; the listener sleeps until
    its socket is readable, so idle it never calls into psycopg at all."""
    only_on_postgresql()
    reads: list[float] = []
    notifies = psycopg.Connection.notifies

    def counted(self, **kwargs):
        reads.append(time.monotonic())
        return notifies(self, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "notifies", counted)
    listener = wake.Listener()
    listener.start()
    try:
        assert listener.listening.wait(10), "the listener never listened"
        wake.work_committed.clear()
        time.sleep(1.5)
        assert reads == [] and not wake.work_committed.is_set()

        with connection.cursor() as cursor:  # autocommit: delivered at once
            cursor.execute(f"NOTIFY {wake.CHANNEL}")
        assert wake.work_committed.wait(10)
        assert len(reads) == 1
    finally:
        listener.stop()
        listener.join(timeout=2)
    assert not listener.is_alive() and not listener.listening.is_set()


def test_a_listener_stopped_before_it_starts_never_listens():
    listener = wake.Listener()
    listener.stop()
    listener.start()
    listener.join(timeout=2)
    assert not listener.is_alive() and not listener.listening.is_set()


def test_an_idle_worker_polls_rarely_while_listening_but_wakes_for_a_delayed_entry():
    idle = worker.build_worker("idle", interval=2.0)
    listener = wake.Listener()  # not started: only its `listening` flag is read
    assert idle.idle_wait(None) == 2.0
    assert idle.idle_wait(listener) == 2.0  # not listening: the safety net's pace

    listener.listening.set()
    assert idle.idle_wait(listener) == worker.LISTENING_POLL_S
    tasks.notify_pending.using(run_after=timezone.now() + timedelta(seconds=5)).enqueue(
        str(uuid.uuid4())
    )
    assert 3 < idle.idle_wait(listener) <= 5
    tasks.notify_pending.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue(
        str(uuid.uuid4())
    )
    assert 0 < idle.idle_wait(listener) <= 1
    other = worker.ToolhubWorker(
        queue_names=["elsewhere"],
        interval=2.0,
        batch=False,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id="other",
        excluded_queue_names=[],
    )
    listener.listening.clear()
    assert other.idle_wait(listener) == 2.0
    listener.listening.set()
    assert other.idle_wait(listener) == worker.LISTENING_POLL_S  # not its queue's entries


def test_an_idle_worker_whose_database_fails_between_claim_and_wait_keeps_polling(
    monkeypatch,
):
    """The wait is decided outside the loop's error handling: a database that went away
    just after an empty claim must not end the worker's thread."""
    idle = worker.build_worker("idle", interval=2.0)
    listener = wake.Listener()
    listener.listening.set()

    def gone(self):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(worker.ToolhubWorker, "next_delayed", gone)
    assert idle.idle_wait(listener) == 2.0


def test_a_listening_worker_runs_a_delayed_entry_when_it_is_due_not_at_its_next_poll():
    """Woken by the enqueue's notification, the worker finds the entry not due yet and
    sleeps until its run_after, not for LISTENING_POLL_S."""
    only_on_postgresql()
    waiting = worker.build_worker("delayed")

    def run() -> None:
        try:
            waiting.run()
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        time.sleep(1)  # its listener is in place
        enqueued = tasks.notify_pending.using(
            run_after=timezone.now() + timedelta(seconds=2)
        ).enqueue(str(uuid.uuid4()))
        deadline = time.monotonic() + 15  # half LISTENING_POLL_S
        while DBTaskResult.objects.get(pk=enqueued.id).status != "SUCCESSFUL":
            assert time.monotonic() < deadline, "the delayed entry waited for the next poll"
            time.sleep(0.2)
        entry = DBTaskResult.objects.get(pk=enqueued.id)
        assert entry.started_at >= entry.run_after
    finally:
        waiting.running = False
        wake.work_committed.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_worker_started_while_the_database_is_down_waits_and_retries(tmp_path):
    """It used to exit within 3 s; now it logs one line per attempt and keeps trying."""
    nowhere = tempfile.mkdtemp(prefix="toolhub-no-pg-")
    env = {
        **os.environ,
        "DATABASE_URL": f"postgresql://postgres@{nowhere.replace('/', '%2F')}/toolhub",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
    }
    log = Path(tmp_path / "worker.log")
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "toolhub_worker"],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "retry 4 in" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        assert process.poll() is None
    finally:
        stop(process)
        os.rmdir(nowhere)
    text = log.read_text(errors="replace")
    assert "failed (OperationalError" in text and "retry 4 in" in text, text
    assert "Traceback" not in text, text
