"""A read-only call without an idempotency key that ends within QUICK_S is written once,
at its end: the record, its tool_call_start and its tool_call_result in one transaction
(runner.records_late; issue 13). One that takes longer is recorded as soon as it passes
QUICK_S, with the time it really started; every other call is recorded before it runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from datetime import datetime

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.invocations import events, runner
from apps.invocations.models import InvocationRecord, RunEvent, Status
from tests.conftest import Agent, allow
from tests.support.threads import in_thread


def writes(queries: CaptureQueriesContext) -> list[str]:
    """The call's own writes (a key's last use is written at most once a minute)."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].split()[0] in ("INSERT", "UPDATE", "DELETE", "WITH")
        and "tenants_apikey" not in q["sql"]
    ]


def updates_record(sql: str) -> bool:
    """An UPDATE of a call's record: on its own, or in a call's one statement."""
    return 'UPDATE "invocations_invocationrecord"' in sql


def events_of(run_id: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))


def parse(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


@pytest.mark.django_db
def test_a_quick_read_only_call_writes_its_record_and_both_events_at_once(
    agent: Agent,
) -> None:
    agent.invoke("core__get_current_time", runId="run-quick")  # the run's row exists
    with CaptureQueriesContext(connection) as queries:
        body = agent.invoke("core__get_current_time", runId="run-quick").json()
    assert body["ok"] is True
    # One record insert, one allocation of two numbers, one insert of both events; on
    # PostgreSQL the three as one statement (apps.invocations.combined).
    if connection.vendor == "postgresql":
        (statement,) = writes(queries)
        for table in ("invocationrecord", "run", "runevent"):
            assert f'INSERT INTO "invocations_{table}"' in statement
    else:
        assert len(writes(queries)) == 3, writes(queries)
    start, result = events_of("run-quick")[-2:]
    assert (start.type, result.type) == ("tool_call_start", "tool_call_result")
    assert result.seq == start.seq + 1
    assert start.message["invocationId"] == result.message["invocationId"] == body["invocationId"]
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert record.started_at is not None and record.ended_at is not None
    assert record.status == Status.SUCCEEDED and record.started_at <= record.ended_at
    assert parse(start.message["at"]) == record.started_at


@pytest.mark.django_db(transaction=True)
def test_a_read_only_call_that_lingers_is_recorded_as_running_while_it_runs(
    agent: Agent, test_tools: list[str]
) -> None:
    allow(agent.tenant, "test__sleep")
    answers: list[dict[str, object]] = []
    caller = threading.Thread(
        target=in_thread(
            lambda: answers.append(
                agent.invoke("test__sleep", runId="run-slow", args={"seconds": 0.4}).json()
            )
        )
    )
    before = time.monotonic()
    caller.start()
    running = None
    while running is None and time.monotonic() - before < 0.35:
        running = InvocationRecord.objects.filter(run_id="run-slow").first()
        time.sleep(0.01)
    caller.join(5)
    assert running is not None, "the record did not appear while the tool ran"
    assert running.status == Status.RUNNING
    seen_after = time.monotonic() - before
    assert seen_after >= runner.QUICK_S  # not before it lingered
    start, result = events_of("run-slow")
    assert (start.type, result.type) == ("tool_call_start", "tool_call_result")
    record = InvocationRecord.objects.get(pk=str(answers[0]["invocationId"]))
    assert record.status == Status.SUCCEEDED
    # The start is when the tool started, not when its record was written.
    assert parse(start.message["at"]) == record.started_at == running.started_at
    assert record.duration_ms is not None and record.duration_ms >= 400


@pytest.mark.django_db
def test_calls_that_change_something_or_carry_a_key_are_recorded_before_they_run(
    agent: Agent,
) -> None:
    with CaptureQueriesContext(connection) as queries:
        agent.invoke(
            "core__planning_setup_plan",
            runId="run-w",
            args={"objective": "o", "initial_steps": ["a"]},
        )
    # The record's insert and its start event before the tool, its update and the
    # result event after: two transactions (on PostgreSQL two statements).
    assert 'INSERT INTO "invocations_invocationrecord"' in writes(queries)[0]
    assert any(updates_record(sql) for sql in writes(queries))
    with CaptureQueriesContext(connection) as queries:
        agent.invoke("core__get_current_time", runId="run-w", idempotencyKey="key-1")
    assert any(updates_record(sql) for sql in writes(queries))


@pytest.mark.django_db
def test_a_quick_call_that_fails_is_recorded_once_with_both_events(
    agent: Agent, test_tools: list[str]
) -> None:
    allow(agent.tenant, "test__crash")
    with CaptureQueriesContext(connection) as queries:
        body = agent.invoke("test__crash", runId="run-crash").json()
    assert body["ok"] is False and body["errorCode"] == "execution"
    assert not any(updates_record(sql) for sql in writes(queries))
    assert [e.type for e in events_of("run-crash")] == ["tool_call_start", "tool_call_result"]


@pytest.mark.django_db
def test_a_refused_call_is_recorded_once_and_claims_no_idempotency_key(agent: Agent) -> None:
    with CaptureQueriesContext(connection) as queries:
        body = agent.invoke("core__get_current_time", args={"x": 1}, idempotencyKey="k").json()
    assert body["errorCode"] == "validation"
    assert not any(updates_record(sql) for sql in writes(queries))
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert record.idempotency_key is None
    assert agent.invoke("core__get_current_time", idempotencyKey="k").json()["ok"] is True


@pytest.mark.django_db(transaction=True)
def test_a_quick_calls_two_events_reach_the_channel_layer_as_one_message(agent: Agent) -> None:
    """One send per quick call, and a feed hands both events to a subscriber in turn
    (apps.invocations.fanout), so the result never waits behind the start's fan-out."""
    layer = get_channel_layer()
    async_to_sync(layer.flush)()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.run_group(agent.tenant.pk, "run-one-send"), channel)

    async def received() -> list[dict]:
        messages = []
        with contextlib.suppress(TimeoutError):
            while True:
                messages.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        return messages

    body = agent.invoke("core__get_current_time", runId="run-one-send").json()
    (message,) = async_to_sync(received)()
    assert message["type"] == "run.events"
    assert [event["type"] for event in message["events"]] == ["tool_call_start", "tool_call_result"]
    assert [event["seq"] for event in message["events"]] == [1, 2]
    assert message["events"][1]["invocationId"] == body["invocationId"]

    # A call recorded before it runs commits its start and its result apart, but its
    # start's push waits for its result's (events.holding): one send as well.
    agent.invoke("core__get_current_time", runId="run-one-send", idempotencyKey="k-1")
    (message,) = async_to_sync(received)()
    assert message["type"] == "run.events"
    assert [event["seq"] for event in message["events"]] == [3, 4]


@pytest.mark.django_db
def test_the_call_line_is_encoded_only_when_it_is_written(
    agent: Agent, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(agent.tenant, "core__get_current_time")
    encoded: list[object] = []
    dumps = runner.json.dumps

    def counting(value: object, **kwargs: object) -> str:
        encoded.append(value)
        return dumps(value, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner.json, "dumps", counting)

    def encodes_per_two_calls(level: int, run_id: str) -> int:
        caplog.clear()
        with caplog.at_level(level, logger="apps.invocations.runner"):
            agent.invoke("core__get_current_time", args={"timezone": "UTC"}, runId=run_id)
            before = len(encoded)  # the run's first call does one-time work
            for _ in range(2):
                agent.invoke("core__get_current_time", args={"timezone": "UTC"}, runId=run_id)
        return len(encoded) - before

    quiet = encodes_per_two_calls(logging.WARNING, "run-quiet")
    assert "tool call" not in caplog.text
    told = encodes_per_two_calls(logging.INFO, "run-told")
    assert "tool call" in caplog.text and "args=" in caplog.text
    assert told == quiet + 2  # the line's arguments, and only when it was written
