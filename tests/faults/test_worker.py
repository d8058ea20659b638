"""The worker and its sweeper outlive their dependencies' faults: a database that is
down, a worker that died holding queue entries, a record closed without its event."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals import decisions, tasks, wake
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
    listener.stopped.set()
    listener.join(timeout=10)
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
