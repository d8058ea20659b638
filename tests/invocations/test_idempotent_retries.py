"""Retries with one idempotencyKey: the call runs once, and every retry answers with the
first attempt's final outcome, waiting for it while it runs (API.md, Idempotent retries)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from apps.approvals.models import ApprovalRequest
from apps.invocations import runner
from apps.invocations.models import InvocationRecord, RunEvent
from tests.conftest import Agent, allow
from tests.support.ledger import stuck_call
from tests.support.server import daphne, invoke
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = "test__counted_wait"
SLEEP = "test__sleep"
CONFIRM = "test__confirm"


@pytest.fixture
def tester(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, *test_tools, name="test tools")
    return agent


def wait_args(trace: Path, ms: int) -> dict[str, Any]:
    return {"path": str(trace), "token": "t", "ms": ms}


def executions(trace: Path) -> int:
    return trace.read_text(encoding="utf-8").splitlines().count("t") if trace.exists() else 0


# ---------------------------------------------------------------- in one process


def test_a_retry_during_the_first_attempt_waits_for_its_outcome(tester, tmp_path):
    trace = tmp_path / "trace.log"
    body = {"args": wait_args(trace, 800), "idempotencyKey": "wait-1"}
    answers: list[Any] = []

    thread = start_thread(lambda: answers.append(tester.invoke(SLOW, **body)))
    while not InvocationRecord.objects.filter(idempotency_key="wait-1").exists():
        time.sleep(0.02)
    retry = tester.invoke(SLOW, **body)
    thread.join()

    assert retry.status_code == 200, retry.content
    assert retry.json()["ok"] is True
    assert retry.json()["status"] == "succeeded"
    assert retry.json() == answers[0].json()
    assert executions(trace) == 1


def test_a_retry_whose_first_attempt_never_ends_answers_409_with_the_record(tester):
    """A first attempt whose process died stays `running` until the sweeper ends it:
    after the tool's timeout (0.5 s) plus the margin, the retry stops waiting."""
    args = {"seconds": 0.1}
    stuck = stuck_call(tester.tenant, tester.principal, SLEEP, args, "stuck-1")

    started = time.monotonic()
    retry = tester.invoke(SLEEP, args=args, idempotencyKey="stuck-1")
    waited = time.monotonic() - started

    assert retry.status_code == 409, retry.content
    assert retry.json()["invocationId"] == str(stuck.pk)
    assert retry.json()["status"] == "running"
    assert "ok" not in retry.json()
    assert retry["Retry-After"] == "1"
    assert 0.5 + runner.REPLAY_MARGIN_S <= waited < 0.5 + runner.REPLAY_MARGIN_S + 2


def test_a_retry_of_a_finished_call_answers_at_once(tester, tmp_path):
    trace = tmp_path / "trace.log"
    body = {"args": wait_args(trace, 0), "idempotencyKey": "done-1"}
    first = tester.invoke(SLOW, **body)

    retry = tester.invoke(SLOW, **body)

    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert executions(trace) == 1


# ---------------------------------------------------------------- real concurrent requests


def _post(base: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, answer, _ = invoke(base, key, body)
    return status, answer


def _together(base: str, key: str, body: dict[str, Any], n: int) -> list[tuple[int, Any]]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _post(base, key, body), range(n)))


@pytest.mark.server
def test_ten_concurrent_identical_requests_run_once_and_answer_the_same(tester, tmp_path):
    trace = tmp_path / "trace.log"
    body = {"toolId": SLOW, "args": wait_args(trace, 1500), "idempotencyKey": "ten-1"}

    with daphne() as base:
        answers = _together(base, tester.key, {**body, "runId": "run-ten"}, 10)

    assert executions(trace) == 1
    assert [status for status, _ in answers] == [200] * 10, answers
    first = answers[0][1]
    assert first["ok"] is True and first["status"] == "succeeded", first
    assert first["result"] == {"token": "t", "executions": 1}
    assert all(answer == first for _, answer in answers)
    assert InvocationRecord.objects.filter(idempotency_key="ten-1").count() == 1
    starts = RunEvent.objects.filter(run_id="run-ten", type="tool_call_start")
    assert starts.count() == 1


@pytest.mark.server
def test_concurrent_retries_of_a_held_call_all_answer_202_with_one_approval(tester):
    body = {"toolId": CONFIRM, "idempotencyKey": "held-1"}

    with daphne() as base:
        answers = _together(base, tester.key, body, 10)

    assert [status for status, _ in answers] == [202] * 10, answers
    assert len({answer["approvalId"] for _, answer in answers}) == 1
    assert ApprovalRequest.objects.count() == 1
