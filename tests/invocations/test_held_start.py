"""A call recorded before it runs holds its tool_call_start's push until its result's
(events.holding, runner._run_holding_start; issue 13): one layer message per quick call.
A tool that outlasts QUICK_S has its start pushed while it runs; any other push of the run
takes the held events along, in order; whatever ends the call releases them; inside a
caller's transaction nothing is held."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from apps.invocations import events, ledger, runner
from apps.invocations.models import InvocationRecord, Status
from tests.approvals.support import subscribed
from tests.conftest import Agent, allow


def pushed(messages: list[dict[str, Any]]) -> list[list[tuple[str, int]]]:
    """Each message's events, as (type, seq)."""
    return [
        [(event["type"], event["seq"]) for event in message.get("events", [message.get("event")])]
        for message in messages
    ]


@pytest.mark.django_db(transaction=True)
def test_a_quick_call_recorded_before_it_runs_pushes_its_start_with_its_result(
    agent: Agent, test_tools: list[str]
) -> None:
    allow(agent.tenant, "test__echo")
    received = subscribed(agent.tenant, "run-held")
    body = agent.invoke(
        "test__echo", runId="run-held", args={"text": "hi"}, idempotencyKey="k-held"
    ).json()
    assert body["ok"] is True
    (message,) = received()
    assert message["type"] == "run.events"
    assert pushed([message]) == [[("tool_call_start", 1), ("tool_call_result", 2)]]
    assert message["events"][0]["invocationId"] == body["invocationId"]
    assert not events._held  # nothing left behind


@pytest.mark.django_db(transaction=True)
def test_a_tool_that_outlasts_quick_s_has_its_start_pushed_while_it_runs(
    agent: Agent, test_tools: list[str]
) -> None:
    allow(agent.tenant, "test__sleep")
    received = subscribed(agent.tenant, "run-long")
    answers: list[dict[str, Any]] = []

    async def call_and_watch() -> tuple[dict[str, Any], str]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(events.run_group(agent.tenant.pk, "run-long"), channel)
        # sync_to_async: the call's pushes come back to this loop, whose layer this is.
        calling = asyncio.ensure_future(
            sync_to_async(
                lambda: answers.append(
                    agent.invoke(
                        "test__sleep", runId="run-long", args={"seconds": 0.4}, idempotencyKey="k"
                    ).json()
                ),
                thread_sensitive=False,
            )()
        )
        first = await asyncio.wait_for(layer.receive(channel), 5)
        # What the record says when the start arrives: the tool is still running.
        status = await sync_to_async(
            lambda: InvocationRecord.objects.get(run_id="run-long").status,
            thread_sensitive=False,
        )()
        await calling
        return first, status

    first, status_then = async_to_sync(call_and_watch)()
    assert first["type"] == "run.event" and first["event"]["type"] == "tool_call_start"
    assert status_then == Status.RUNNING
    assert answers[0]["ok"] is True
    assert pushed(received()) == [[("tool_call_start", 1)], [("tool_call_result", 2)]]
    assert not events._held


@pytest.mark.django_db(transaction=True)
def test_another_push_of_the_run_takes_the_held_events_along_in_order(agent: Agent) -> None:
    received = subscribed(agent.tenant, "run-mixed")
    start = events.Event("tool_call_start", "call-1", "core__x", {"args": {}})
    with events.holding(agent.tenant.pk, "run-mixed"):
        events.emit_many(agent.tenant, "run-mixed", [start])
        # Another run's events are not held.
        events.emit_many(agent.tenant, "run-other", [start])
    assert received() == []
    other = events.Event("tool_call_start", "call-2", "core__x", {"args": {}})
    events.emit_many(agent.tenant, "run-mixed", [other])
    assert pushed(received()) == [[("tool_call_start", 1), ("tool_call_start", 2)]]
    events.release(agent.tenant.pk, "run-mixed")  # already gone with the other push
    assert received() == []


@pytest.mark.django_db(transaction=True)
def test_release_pushes_what_is_held_once(agent: Agent) -> None:
    received = subscribed(agent.tenant, "run-release")
    start = events.Event("tool_call_start", "call-1", "core__x", {"args": {}})
    with events.holding(agent.tenant.pk, "run-release"):
        events.emit_many(agent.tenant, "run-release", [start])
    assert received() == []
    events.release(agent.tenant.pk, "run-release")
    assert pushed(received()) == [[("tool_call_start", 1)]]
    events.release(agent.tenant.pk, "run-release")
    assert received() == []


@pytest.mark.django_db(transaction=True)
def test_a_call_that_fails_unexpectedly_still_pushes_its_start(
    agent: Agent, test_tools: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(agent.tenant, "test__echo")
    received = subscribed(agent.tenant, "run-broken")

    def broken(call: runner.Call, output: Any) -> dict[str, Any]:
        raise RuntimeError("a bug after the tool ran")

    monkeypatch.setattr(runner, "validate_output", broken)
    with pytest.raises(RuntimeError):
        agent.invoke("test__echo", runId="run-broken", args={"text": "x"}, idempotencyKey="k")
    assert pushed(received()) == [[("tool_call_start", 1)]]
    assert not events._held


@pytest.mark.django_db(transaction=True)
def test_a_key_claimed_meanwhile_holds_nothing(
    agent: Agent, test_tools: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(agent.tenant, "test__echo")
    first = agent.invoke("test__echo", runId="run-key", args={"text": "x"}, idempotencyKey="k")
    received = subscribed(agent.tenant, "run-key")

    # The first call's record appears after the replay check: the start's insert fails on
    # the key, and the runner answers with the first call.
    def blind(call: runner.Call) -> None:  # computes the key, does not look it up
        assert call.tool is not None
        call.key = ledger.key_for(
            call.tool, call.caller.principal, call.run_id, "k", call.args_json or {}, ""
        )

    monkeypatch.setattr(runner, "find_replay", blind)
    winners: list[runner.Call] = []
    winner = runner._idempotency_winner

    def spied(call: runner.Call) -> InvocationRecord:
        winners.append(call)
        return winner(call)

    monkeypatch.setattr(runner, "_idempotency_winner", spied)
    again = agent.invoke("test__echo", runId="run-key", args={"text": "x"}, idempotencyKey="k")
    assert len(winners) == 1  # the insert lost on the key
    assert again.json()["invocationId"] == first.json()["invocationId"]
    assert received() == []
    assert not events._held


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_start_is_pushed_at_its_commit(
    agent: Agent, test_tools: list[str]
) -> None:
    allow(agent.tenant, "test__echo")
    received = subscribed(agent.tenant, "run-atomic")
    with transaction.atomic():
        agent.invoke("test__echo", runId="run-atomic", args={"text": "x"}, idempotencyKey="k")
        assert not events._held
    # The start and the result were committed together: each pushed as it was written.
    assert pushed(received()) == [[("tool_call_start", 1)], [("tool_call_result", 2)]]
