"""A stopping server finishes the requests it is serving, refuses new ones, then exits
(toolhub/server/draining.py). Under load, SIGTERM used to leave Daphne running until it was
killed: a request's thread, still sending its call's events, waited for an event loop
that had stopped, and the calls in flight lost their answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from apps.approvals import decisions
from apps.invocations.models import InvocationRecord, RunEvent
from apps.policies.models import Outcome, PolicyRule
from tests.approvals.support import make_operator
from tests.conftest import allow, make_agent
from tests.support.server import daphne, invoke
from toolhub.server import draining
from toolhub.server.draining import Draining

# Not about the database: one leg of the gate (tests/conftest.py).
pytestmark = pytest.mark.one_leg

# ---------------------------------------------------------------- the wrapper alone


@pytest.fixture(autouse=True)
def _not_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping is the process's state: each test starts before it, and leaves none."""
    monkeypatch.setattr(draining, "_stopping", False)
    monkeypatch.setattr(draining, "_on_stop", set())


class App:
    """An ASGI app whose request takes until `release` is set, then answers."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.started.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        self.finished += 1


async def nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def collector() -> tuple[list[dict[str, Any]], Any]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return sent, send


async def cancelled_while_serving(app: App) -> tuple[list[dict[str, Any]], asyncio.Task[None]]:
    """A request to `app` through Draining, cancelled as Daphne cancels every request on
    SIGTERM once the app has started it: what was sent, and the request's task."""
    sent, send = collector()
    task = asyncio.ensure_future(Draining(app)({"type": "http"}, nothing, send))
    await app.started.wait()
    task.cancel()
    return sent, task


async def test_a_request_cancelled_from_outside_finishes_and_answers_first():
    app = App()
    sent, task = await cancelled_while_serving(app)
    await asyncio.sleep(0.05)
    assert not task.done()  # still serving
    app.release.set()
    assert await asyncio.wait_for(task, 5) is None  # ended as served, not cancelled
    assert not task.cancelled()
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert app.finished == 1


async def test_a_second_cancellation_leaves_the_request():
    app = App()
    _, task = await cancelled_while_serving(app)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    app.release.set()  # the request itself was not cancelled: it still finishes
    for _ in range(100):
        if app.finished:
            break
        await asyncio.sleep(0.01)
    assert app.finished == 1


async def test_stopping_waits_for_the_requests_being_served_and_refuses_new_ones():
    app = App()
    wrapper = Draining(app)
    _, send = collector()
    serving = [asyncio.ensure_future(wrapper({"type": "http"}, nothing, send)) for _ in range(3)]
    await app.started.wait()
    await asyncio.sleep(0.01)
    assert wrapper.serving == 3
    drained = wrapper.stop()
    assert wrapper.stop() is drained  # Twisted may ask once; asking again is the same
    refused, refuse_send = collector()
    await wrapper({"type": "http"}, nothing, refuse_send)  # answered at once
    assert app.finished == 0
    start, body = refused
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"retry-after"] == b"1"
    assert headers[b"connection"] == b"close"
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {
        "detail": "The server is restarting; retry in 1 seconds.",
        "retryAfterSeconds": 1,
    }
    await asyncio.sleep(0.05)
    assert not drained.done()
    app.release.set()
    await asyncio.wait_for(drained, 5)
    await asyncio.gather(*serving)
    assert app.finished == 3 and wrapper.serving == 0


async def test_stopping_an_idle_server_is_done_at_once():
    assert Draining(App()).stop().done()


async def test_waits_that_would_hold_the_stop_are_told_once():
    """An MCP event stream or task wait ends when the server stops (apps/mcp/server)."""
    told: list[str] = []
    draining.on_stop(lambda: told.append("stream"))
    forget = draining.on_stop(lambda: told.append("forgotten"))
    forget()
    assert not draining.is_stopping()
    Draining(App()).stop()
    assert draining.is_stopping()
    assert told == ["stream"]
    Draining(App()).stop()  # asked again: nobody is told twice
    assert told == ["stream"]
    draining.on_stop(lambda: told.append("late"))  # after the stop: at once
    assert told == ["stream", "late"]


async def test_the_stop_waits_for_what_a_callback_returns():
    """The embedded worker's current call (apps/approvals/worker.py) holds the stop."""
    release = asyncio.Event()
    draining.on_stop(lambda: asyncio.ensure_future(release.wait()))
    stopped = Draining(App()).stop()
    await asyncio.sleep(0.05)
    assert not stopped.done()
    release.set()
    await asyncio.wait_for(stopped, 5)


async def test_a_failing_request_is_still_counted_out():
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    wrapper = Draining(failing)
    _, send = collector()
    with pytest.raises(RuntimeError, match="boom"):
        await wrapper({"type": "http"}, nothing, send)
    assert wrapper.serving == 0
    assert wrapper.stop().done()


# ---------------------------------------------------------------- Daphne, as deployed

CALLS = 6


def call(base: str, key: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    return invoke(base, key, body, timeout=30)


@pytest.mark.server
def test_sigterm_answers_the_calls_in_flight_refuses_new_ones_and_exits(
    transactional_db: None, test_tools: list[str], tmp_path: Path
) -> None:
    agent = make_agent("draining")
    allow(agent.tenant, "test__counted_wait")
    trace = tmp_path / "trace"
    trace.touch()
    with daphne() as server, ThreadPoolExecutor(CALLS) as pool:
        in_flight = [
            pool.submit(
                call,
                server,
                agent.key,
                {
                    "toolId": "test__counted_wait",
                    "args": {"path": str(trace), "token": f"t{n}", "ms": 1500},
                },
            )
            for n in range(CALLS)
        ]
        deadline = time.monotonic() + 20
        while len(trace.read_text().splitlines()) < CALLS:  # every call is in its tool
            assert time.monotonic() < deadline, [f.result() for f in in_flight if f.done()]
            time.sleep(0.02)
        os.kill(server.pid, signal.SIGTERM)
        time.sleep(0.3)
        status, body, headers = call(server, agent.key, {"toolId": "test__counted_wait"})
        assert status == 503, body
        assert headers["Retry-After"] == "1"
        assert body["retryAfterSeconds"] == 1
        answers = [future.result(timeout=30) for future in in_flight]
        assert server.process.wait(timeout=20) == 0, server.output()[-3000:]
    assert [status for status, _, _ in answers] == [200] * CALLS
    assert sorted(body["result"]["token"] for _, body, _ in answers) == [
        f"t{n}" for n in range(CALLS)
    ]
    assert all(body["ok"] for _, body, _ in answers)
    # Recorded, and the result events written, as for any call.
    records = InvocationRecord.objects.filter(tenant=agent.tenant)
    assert sorted(records.values_list("status", flat=True)) == ["succeeded"] * CALLS
    results = RunEvent.objects.filter(tenant=agent.tenant, type="tool_call_result")
    assert results.count() == CALLS


@pytest.mark.server
def test_sigterm_lets_the_embedded_worker_finish_its_call_and_leaves_the_next_queued(
    transactional_db: None, test_tools: list[str], tmp_path: Path
) -> None:
    """The embedded worker is a daemon thread: the process exiting under it left the
    approved call it was running `running`, for the sweeper to record as failed. A
    stopping server now lets it finish the call it runs, claim nothing more, and waits
    for it; the next approved call stays queued for the next start."""
    agent = make_agent("embedded")
    policy = allow(agent.tenant, "test__counted_wait")
    PolicyRule.objects.create(
        policy=policy,
        tool_pattern="test__counted_wait",
        condition="true",
        outcome=Outcome.REQUIRE_APPROVAL,
    )
    operator = make_operator("olga", agent.tenant, tools=("test__counted_wait",))
    trace = tmp_path / "trace"
    trace.touch()
    held = {}
    with daphne({"TOOLHUB_EMBEDDED_WORKER": "1"}) as server:
        for token in ("first", "next"):
            args = {"path": str(trace), "token": token, "ms": 2000}
            status, held[token], _ = call(
                server, agent.key, {"toolId": "test__counted_wait", "args": args}
            )
            assert status == 202, held[token]
        decisions.decide(held["first"]["approvalId"], operator, "approve")
        deadline = time.monotonic() + 20
        while "first" not in trace.read_text():  # the worker is running it
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.02)
        decisions.decide(held["next"]["approvalId"], operator, "approve")  # queued behind
        os.kill(server.pid, signal.SIGTERM)
        assert server.process.wait(timeout=20) == 0, server.output()[-3000:]
    first = InvocationRecord.objects.get(pk=held["first"]["invocationId"])
    assert first.status == "succeeded", (first.status, first.error_code)
    assert first.result == {"token": "first", "executions": 1}
    assert RunEvent.objects.filter(
        tenant=agent.tenant, tool_call_id=first.tool_call_id, type="tool_call_result"
    ).exists()
    after = InvocationRecord.objects.get(pk=held["next"]["invocationId"])
    assert after.status == "queued"
    assert trace.read_text().split() == ["first"]  # the next one never started
