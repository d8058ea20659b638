"""Call leases across processes (issue 47, apps/invocations/leases.py): two Daphne
processes and task workers on one PostgreSQL (and Redis), with a short lease.

- a call whose lease is renewed while it runs past the lease is not settled;
- a Daphne paused (SIGSTOP) past the lease during a call: the call is settled; resumed
  (SIGCONT), its late end does not overwrite the settled record, nor adds a second
  result event, and is logged;
- a Daphne killed (-9) during an unheld call: a same-key retry on the other Daphne
  finds its owner dead (its liveness lock free) and answers at once, before the lease
  ran out, with the call settled failed (`execution`: it may have run); its result
  event reaches a stream on the other process, and the next retry runs the call again;
- a worker killed (-9) mid-call: another worker's sweeper settles the call and its
  approval, with its result event;
- a worker killed (-9) while its approved call waited for a concurrency slot (its tool
  never ran): the call goes back to the queue, and the next worker runs it, once.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations.models import InvocationRecord, RunEvent, Status
from apps.policies.models import Policy
from apps.tools.models import Tool
from tests.conftest import allow, make_agent
from tests.faults.test_outages import worker as killable_worker
from tests.faults.test_worker import listening_backend
from tests.streams.conftest import events, open_ws, operator
from tests.streams.test_scale_out import shared_env, worker
from tests.support.redis import redis_server
from tests.support.server import daphne, invoke
from tests.support.threads import start_thread

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]

WAIT = "test__counted_wait"  # one line per execution in its trace, then `ms` (timeout 5 s)
LEASE_MS = 2500  # renewed every 0.5 s; overdue after 1 s


@pytest.fixture(autouse=True)
def _postgresql_only(db: None) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("several processes write one database at once: run on PostgreSQL")


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def running(**lookup: Any) -> InvocationRecord | None:
    return InvocationRecord.objects.filter(status=Status.RUNNING, **lookup).first()


def ended(pk: Any) -> InvocationRecord | None:
    return InvocationRecord.objects.filter(pk=pk, ended_at__isnull=False).first()


def lines(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


def test_calls_whose_process_died_are_settled_and_renewed_ones_are_not(test_tools, tmp_path):
    agent = make_agent("acme")
    allow(agent.tenant, WAIT, "test__confirm")
    olga = operator("olga", agent.tenant, decide=(WAIT,))
    bearer = {"Authorization": f"Bearer {agent.key}"}

    with redis_server() as redis_url:
        env = {
            **shared_env(redis_url),
            "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "TOOLHUB_CALL_LEASE_MS": str(LEASE_MS),
            "TOOLHUB_LEASE_SWEEP_MS": "200",
        }
        with daphne(env) as a, daphne(env) as b, worker(env):
            # ---- renewed: a call of 4 s on a 2.5 s lease, swept every 0.2 s, succeeds.
            long_trace = tmp_path / "long.log"
            args = {"path": str(long_trace), "token": "t", "ms": 4000}
            status, body, _ = invoke(b, agent.key, {"toolId": WAIT, "args": args})
            assert status == 200, body
            assert body["ok"] is True, (body.get("errorCode"), body.get("safeMessage"))
            # Settled by mistake, its end would still have come, as a second result.
            results = RunEvent.objects.filter(run_id=body["runId"], type="tool_call_result")
            assert results.count() == 1

            # ---- a Daphne paused past the lease: settled; its late end is not written.
            trace = tmp_path / "paused.log"
            args = {"path": str(trace), "token": "t", "ms": 1000}
            call = {"toolId": WAIT, "args": args, "idempotencyKey": "paused-1", "runId": "run-p"}
            late: queue.Queue[Any] = queue.Queue()
            start_thread(lambda: late.put(invoke(a, agent.key, call)))
            paused = wait_for(lambda: running(run_id="run-p"), 20, "the call")
            wait_for(lambda: lines(trace) == 1, 20, "the tool to run")
            os.kill(a.pid, signal.SIGSTOP)
            try:
                # Its owner is alive (its lock held) but late: 409, the time left as hint.
                status, body, headers = invoke(b, agent.key, call)
                assert status == 409, body
                assert (body["invocationId"], body["status"]) == (str(paused.pk), "running")
                assert 0 < body["retryAfterMs"] <= LEASE_MS
                assert headers["Retry-After"] == str(math.ceil(body["retryAfterMs"] / 1000))
                settled = wait_for(lambda: ended(paused.pk), 30, "the paused call to settle")
            finally:
                os.kill(a.pid, signal.SIGCONT)
            assert (settled.status, settled.error_code) == (Status.FAILED, "execution")
            status, body, _ = late.get(timeout=30)  # its own answer: the settled record
            assert status == 200, body
            assert (body["invocationId"], body["ok"]) == (str(paused.pk), False)
            assert body["errorCode"] == "execution", body
            after = InvocationRecord.objects.get(pk=paused.pk)
            assert (after.status, after.error_code, after.ended_at, after.result) == (
                Status.FAILED,
                "execution",
                settled.ended_at,
                None,
            )
            results = RunEvent.objects.filter(run_id=paused.run_id, type="tool_call_result")
            assert results.count() == 1
            assert f"late end of call {paused.pk}" in a.output()

            # ---- a Daphne killed during an unheld call.
            trace = tmp_path / "orphan.log"
            args = {"path": str(trace), "token": "t", "ms": 4000}
            call = {"toolId": WAIT, "args": args, "idempotencyKey": "orphan-1", "runId": "run-o"}
            with open_ws(b, "/ws/v1/runs/run-o/", bearer) as stream:
                answers: queue.Queue[Any] = queue.Queue()

                def first_attempt() -> None:
                    try:
                        answers.put(invoke(a, agent.key, call))
                    except OSError as error:  # its server was killed under it
                        answers.put(error)

                start_thread(first_attempt)
                orphan = wait_for(lambda: running(idempotency_key="orphan-1"), 20, "the call")
                assert not orphan.lease_owner.startswith("0/")  # its owner's lock's key
                wait_for(lambda: lines(trace) == 1, 20, "the tool to run")
                os.kill(a.pid, signal.SIGKILL)
                assert isinstance(answers.get(timeout=30), OSError)

                # Its owner's liveness lock is free: answered at once with the settled
                # call, before its lease (never renewed since the kill) ran out.
                status, body, _ = invoke(b, agent.key, call)
                assert status == 200, body
                assert body["invocationId"] == str(orphan.pk)
                assert (body["ok"], body["errorCode"]) == (False, "execution"), body
                settled = InvocationRecord.objects.get(pk=orphan.pk)
                assert (settled.status, settled.error_code) == (Status.FAILED, "execution")
                assert settled.ended_at < settled.lease_expires_at
                received = events(stream, 2, timeout=30)  # its start, then its result
                assert [e["type"] for e in received] == ["tool_call_start", "tool_call_result"]
                assert received[1]["invocationId"] == str(orphan.pk)
                assert (received[1]["ok"], received[1]["errorCode"]) == (False, "execution")

                status, body, _ = invoke(b, agent.key, call)  # the ledger: failures are free
                assert status == 200, body
                assert (body["ok"], body["retryOf"], body["attempt"]) == (True, str(orphan.pk), 2)
                assert lines(trace) == 2

        # ---- a worker killed mid-call; another worker's sweeper settles it.
        Policy.objects.filter(tenant=agent.tenant, name="allow").update(
            approval_effects=["read_only"]
        )
        with daphne(env) as web:
            trace = tmp_path / "held.log"
            args = {"path": str(trace), "token": "t", "ms": 4000}
            status, held, _ = invoke(web, agent.key, {"toolId": WAIT, "args": args})
            assert status == 202, held
            with killable_worker(env, tmp_path / "doomed.log") as doomed:
                decisions.decide(held["approvalId"], olga, "approve", "ok")
                record = wait_for(lambda: running(pk=held["invocationId"]), 30, "the worker")
                wait_for(lambda: lines(trace) == 1, 20, "the tool to run")
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(timeout=10)
                assert running(pk=record.pk) is not None  # nobody else ran or ended it
                with worker(env):
                    settled = wait_for(lambda: ended(record.pk), 30, "the sweeper to settle it")
                approval = ApprovalRequest.objects.get(pk=held["approvalId"])
            assert (settled.status, settled.error_code) == (Status.FAILED, "execution")
            assert approval.status == ApprovalStatus.FAILED
            assert lines(trace) == 1  # never run again

            # ---- a worker killed before its approved call's tool ran: offered again.
            Tool.objects.filter(pk=WAIT).update(max_concurrency=1)
            trace = tmp_path / "reoffered.log"
            args = {"path": str(trace), "token": "q", "ms": 0}
            status, held, _ = invoke(web, agent.key, {"toolId": WAIT, "args": args})
            assert status == 202, held
            Policy.objects.filter(tenant=agent.tenant, name="allow").update(approval_effects=[])
            with killable_worker(env, tmp_path / "doomed-waiting.log") as doomed:
                wait_for(listening_backend, 30, "the worker to listen for work")
                busy = tmp_path / "busy.log"  # holds the tool's one slot for 4 s
                occupant = {"toolId": WAIT, "args": {"path": str(busy), "token": "b", "ms": 4000}}
                start_thread(lambda: invoke(web, agent.key, occupant))
                wait_for(lambda: lines(busy) == 1, 20, "the occupant to hold the slot")
                decisions.decide(held["approvalId"], olga, "approve", "ok")
                waiting = lambda: running(pk=held["invocationId"], tool_pending=True)  # noqa: E731
                wait_for(waiting, 30, "the worker to wait for the slot")
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(timeout=10)
            assert lines(trace) == 0  # its tool never ran
            with worker(env):
                done = wait_for(lambda: ended(held["invocationId"]), 30, "the call to run")
            approval = ApprovalRequest.objects.get(pk=held["approvalId"])
        assert (done.status, done.ok) == (Status.SUCCEEDED, True), done.safe_message
        assert (approval.status, approval.reoffered) == (ApprovalStatus.SUCCEEDED, 1)
        assert lines(trace) == 1  # run once, by the next worker
        results = RunEvent.objects.filter(run_id=held["runId"], type="tool_call_result")
        assert results.count() == 1
