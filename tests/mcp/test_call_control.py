"""Call control of imported tools against real SDK servers (tests/mcp/servers/call_control.py):
a cancelled or timed-out call is cancelled upstream too, and an upstream's Retry-After
becomes the call's retryAfterMs, which the runner's retries honour."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord
from apps.tools.models import Tool
from tests.conftest import Agent, allow, make_agent
from tests.mcp.conftest import SERVERS, enable
from tests.support.processes import stop
from tests.support.server import free_port
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]

TOOLS = ("wait_for_cancel", "flaky", "hinted", "pid")


@pytest.fixture(scope="module")
def control_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("call-control") / "log.txt"


@pytest.fixture(scope="module")
def http_url(control_log: Path) -> Iterator[str]:
    """The server over streamable HTTP, one process for the module."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, f"{SERVERS}/call_control.py", "http", str(port), str(control_log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def added(name: str, transport: str, http_url: str, log: Path, timeout_ms: int = 20000) -> Agent:
    """The server imported as `name` and its tools enabled for an agent of tenant acme."""
    if transport == "http":
        where = ["--url", http_url, "--allow-private-network"]
    else:
        where = ["--command", f"python {SERVERS}/call_control.py stdio {log}"]
    call_command("mcp_add", name, *where, "--timeout-ms", str(timeout_ms), stdout=io.StringIO())
    call_command("mcp_sync", name, stdout=io.StringIO())
    ids = [f"mcp__{name}__{tool}" for tool in TOOLS]
    enable(*ids)
    agent = make_agent("acme")
    allow(agent.tenant, *ids)
    return agent


def logged(log: Path, line: str, within: float = 20) -> bool:
    """Whether the server wrote `line` to its log (waiting for it up to `within` s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text().splitlines():
            return True
        time.sleep(0.05)
    return False


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    worker = threading.Thread(target=in_thread(lambda: answers.append(call())))
    worker.start()
    return worker, answers


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_cancelled_call_is_cancelled_upstream_and_ends_cancelled(
    transport, http_url, control_log
):
    agent = added("ctl", transport, http_url, control_log)
    tag = f"cancel-{transport}"
    pid = agent.invoke("mcp__ctl__pid").json()["result"]["structuredContent"]["result"]
    worker, answers = in_background(
        lambda: agent.invoke("mcp__ctl__wait_for_cancel", args={"tag": tag}, runId=tag).json()
    )
    assert logged(control_log, f"started {tag}"), "the upstream never got the call"
    deadline = time.monotonic() + 10
    record = None
    while record is None and time.monotonic() < deadline:
        record = InvocationRecord.objects.filter(run_id=tag, status="running").first()
        time.sleep(0.02)  # recorded once the call outlives the quick path
    assert record is not None
    canceller = APIClient()
    canceller.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
    asked = canceller.post(f"/api/v1/invocations/{record.pk}/cancel/")
    assert asked.status_code in (200, 202), asked.content
    assert logged(control_log, f"cancelled {tag}"), "the upstream never saw the cancellation"
    worker.join(20)
    assert answers and answers[0]["errorCode"] == "cancelled", answers
    record.refresh_from_db()
    assert record.status == "cancelled"
    # The server was told, not stopped: the same process serves the next call.
    again = agent.invoke("mcp__ctl__pid").json()
    assert again["result"]["structuredContent"]["result"] == pid, again


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_call_past_its_deadline_is_cancelled_upstream(transport, http_url, control_log):
    agent = added("late", transport, http_url, control_log, timeout_ms=1500)
    tag = f"deadline-{transport}"
    body = agent.invoke("mcp__late__wait_for_cancel", args={"tag": tag}, runId=tag).json()
    assert body["errorCode"] == "timeout", body
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert (record.status, record.error_code) == ("failed", "timeout")
    assert logged(control_log, f"started {tag}")
    assert logged(control_log, f"cancelled {tag}"), "the upstream never saw the cancellation"


def retrying(tool_id: str, attempts: int) -> None:
    """Staff give the imported tool `attempts` retries with a 10 ms backoff, no jitter."""
    Tool.objects.filter(pk=tool_id).update(
        retry_attempts=attempts, retry_backoff_ms=10, retry_jitter=0, call_settings_by_staff=True
    )


def flaky(agent: Agent, key: str, **args: Any) -> Any:
    """A call of flaky (idempotency key given: an external side effect is retried only
    with one); the HTTP layer answers its first `fails` calls with `status`."""
    return agent.invoke("mcp__busy__flaky", args={"key": key, **args}, idempotencyKey=f"idem-{key}")


@pytest.mark.parametrize(("status", "code"), [(503, "unavailable"), (429, "rate_limited")])
def test_a_busy_answer_with_retry_after_is_retried_once_the_server_said(
    http_url, control_log, status, code
):
    agent = added("busy", "http", http_url, control_log)
    retrying("mcp__busy__flaky", 2)
    key = f"once {status}"
    body = flaky(agent, key, fails=1, status=status, retry_after="1").json()
    assert body["ok"] is True, body
    assert body["result"]["structuredContent"] == {"result": f"served {key}"}
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    (tried,) = record.retries
    assert (tried["errorCode"], tried["retryAfterMs"]) == (code, 1000), tried
    assert tried["waitMs"] >= 1000  # the server's hint, not the 10 ms backoff


def test_a_429_is_rate_limited_with_the_servers_hint(http_url, control_log):
    agent = added("busy", "http", http_url, control_log)
    answer = flaky(agent, "limited", fails=1, status=429, retry_after="120")
    body = answer.json()
    assert (body["errorCode"], body["retryAfterMs"]) == ("rate_limited", 120000), body
    assert answer["Retry-After"] == "120"
    # The session serves on: the next call (the server's second for this key) passes.
    assert flaky(agent, "limited").json()["ok"] is True


def test_a_hint_longer_than_the_runner_waits_goes_to_the_caller(http_url, control_log):
    agent = added("busy", "http", http_url, control_log)
    retrying("mcp__busy__flaky", 2)
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=40), usegmt=True)
    body = flaky(agent, "dated", fails=1, status=503, retry_after=when).json()
    assert body["errorCode"] == "unavailable", body
    assert 30000 <= body["retryAfterMs"] <= 40000, body  # an HTTP-date, read against now
    assert InvocationRecord.objects.get(pk=body["invocationId"]).retries is None


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("-5", None),  # negative: ignored
        ("1.5", None),  # delay-seconds are whole: ignored
        ("soon", None),  # malformed: ignored
        ("Wed, 21 Oct 2015 07:28:00", None),  # a date without its zone: ignored
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0),  # a date already past: now
        ("99999999999", 3_600_000),  # huge: capped at an hour
    ],
)
def test_a_bad_retry_after_is_ignored_or_capped(http_url, control_log, header, expected):
    agent = added("busy", "http", http_url, control_log)
    body = flaky(agent, f"bad {header}", fails=1, status=503, retry_after=header).json()
    assert body["errorCode"] == "unavailable", body
    assert body.get("retryAfterMs") == expected, body


def test_a_json_rpc_error_carrying_retry_after_ms_is_retried_after_it(http_url, control_log):
    agent = added("busy", "http", http_url, control_log)
    retrying("mcp__busy__hinted", 1)
    body = agent.invoke(
        "mcp__busy__hinted",
        args={"key": "rpc", "fails": 1, "retry_after_ms": 300},
        idempotencyKey="idem-rpc",
    ).json()
    assert body["ok"] is True, body
    (tried,) = InvocationRecord.objects.get(pk=body["invocationId"]).retries
    assert (tried["errorCode"], tried["retryAfterMs"]) == ("unavailable", 300), tried
    assert tried["waitMs"] >= 300
    # A hint that is no number of ms >= 0 is not one: the error is the tool's own failure.
    body = agent.invoke(
        "mcp__busy__hinted", args={"key": "neg", "fails": 1, "retry_after_ms": -1}
    ).json()
    assert (body["errorCode"], body.get("retryAfterMs")) == ("execution", None), body
