"""The runner's retries of `unavailable` and `timeout` (seed 004): backoff, the tool's
retryAfterMs hint (capped), every attempt in the record and as tool_call_retry events."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from apps.invocations import runner
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tools.models import Tool
from tests.conftest import Agent, allow
from tests.console.test_websocket_docs import assert_documented
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)

FLAKY = "test__flaky"
SEND = "test__flaky_send"


@pytest.fixture
def tester(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, *test_tools, name="test tools")
    Tool.objects.filter(pk__in=[FLAKY, SEND]).update(retry_attempts=2, retry_backoff_ms=0)
    return agent


def attempts(trace: Path) -> int:
    return trace.read_text(encoding="utf-8").splitlines().count("t")


def args_of(trace: Path, failures: int, hint: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"path": str(trace), "token": "t", "failures": failures}
    if hint is not None:
        args["retry_after_ms"] = hint
    return args


def test_an_unavailable_attempt_is_tried_again_and_shown(tester, tmp_path):
    trace = tmp_path / "t.log"

    body = tester.invoke(FLAKY, args=args_of(trace, 1), runId="run-retry").json()

    assert body["ok"] is True and body["result"]["executions"] == 2
    [retry] = body["retries"]
    assert (retry["attempt"], retry["errorCode"]) == (1, "unavailable")
    assert retry["safeMessage"] == "The upstream is down."
    kinds = list(RunEvent.objects.filter(run_id="run-retry").values_list("type", flat=True))
    assert kinds == ["tool_call_start", "tool_call_retry", "tool_call_result"]
    event = RunEvent.objects.get(run_id="run-retry", type="tool_call_retry").message
    assert (event["attempt"], event["invocationId"]) == (1, body["invocationId"])
    assert_documented(event)  # docs/asyncapi.yaml's toolCallRetry


def test_retries_exhausted_end_the_call_with_the_last_attempts_outcome(tester, tmp_path):
    trace = tmp_path / "t.log"

    body = tester.invoke(FLAKY, args=args_of(trace, 5)).json()

    assert (body["ok"], body["errorCode"]) == (False, "unavailable")
    assert [r["attempt"] for r in body["retries"]] == [1, 2]
    assert attempts(trace) == 3


def test_a_huge_retry_after_is_capped_and_handed_to_the_caller(tester, tmp_path):
    trace = tmp_path / "t.log"

    body = tester.invoke(FLAKY, args=args_of(trace, 1, 10**12)).json()

    assert (body["ok"], body["errorCode"]) == (False, "unavailable")
    assert body["retryAfterMs"] == runner.MAX_RETRY_AFTER_MS
    assert "retries" not in body and attempts(trace) == 1


def test_a_short_retry_after_is_waited_and_a_negative_one_ignored(tester, tmp_path):
    waited = tester.invoke(FLAKY, args=args_of(tmp_path / "a.log", 1, 30)).json()
    negative = tester.invoke(FLAKY, args=args_of(tmp_path / "b.log", 1, -5)).json()

    assert waited["ok"] is True
    assert waited["retries"][0]["retryAfterMs"] == 30
    assert waited["retries"][0]["waitMs"] >= 30
    assert negative["ok"] is True
    assert negative["retries"][0]["retryAfterMs"] == 0  # clamped to [0, cap]


def test_an_external_side_effect_is_retried_only_with_an_idempotency_key(tester, tmp_path):
    keyless = tester.invoke(SEND, args=args_of(tmp_path / "a.log", 1)).json()
    keyed = tester.invoke(SEND, args=args_of(tmp_path / "b.log", 1), idempotencyKey="s-1").json()

    assert (keyless["ok"], keyless["errorCode"]) == (False, "unavailable")
    assert attempts(tmp_path / "a.log") == 1
    assert keyed["ok"] is True and len(keyed["retries"]) == 1


def test_a_cancel_while_the_runner_waits_to_retry_ends_the_call_without_another_attempt(
    tester, tmp_path
):
    trace = tmp_path / "t.log"
    answers: list[Any] = []
    body = {"args": args_of(trace, 5, hint=4000), "runId": "run-wait"}  # waits 4 s to retry
    thread = start_thread(lambda: answers.append(tester.invoke(FLAKY, **body)))
    while not RunEvent.objects.filter(run_id="run-wait", type="tool_call_retry").exists():
        assert thread.is_alive(), answers
        time.sleep(0.02)
    record = InvocationRecord.objects.get(run_id="run-wait")

    assert tester.client.post(f"/api/v1/invocations/{record.pk}/cancel/").status_code == 200
    thread.join()

    answer = answers[0].json()
    assert (answer["status"], answer["errorCode"]) == ("cancelled", "cancelled")
    assert len(answer["retries"]) == 1
    assert attempts(trace) == 1  # the second attempt never ran


def test_an_external_side_effect_in_a_run_is_retried_under_the_key_derived_for_the_run(
    tester, tmp_path
):
    # A key derived per run (a deployment's TOOLHUB_IDEMPOTENCY_DEFAULTS, or the admin).
    Tool.objects.filter(pk=SEND).update(idempotency_strategy="auto", idempotency_scope="run")
    body = tester.invoke(SEND, args=args_of(tmp_path / "c.log", 1), runId="run-send").json()

    assert body["ok"] is True and len(body["retries"]) == 1
    assert body["idempotencyStrategy"] == "auto"
    assert attempts(tmp_path / "c.log") == 2
