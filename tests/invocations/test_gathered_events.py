"""events.gathered(): the events of several runs, emitted in one transaction, numbered
with one upsert and written with one insert (issue 13: a worker's transaction closes one
call and starts the next), each run's numbers consecutive in the order emitted."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.invocations import events
from apps.invocations.models import Run, RunEvent
from tests.conftest import Agent

pytestmark = pytest.mark.django_db


def event(kind: events.EventType, call: str) -> events.Event:
    return events.Event(kind, call, "core__get_current_time", {"n": call})


def numbers(agent: Agent, run_id: str) -> list[tuple[int, str, str]]:
    return [
        (row.seq, row.type, row.tool_call_id)
        for row in RunEvent.objects.filter(tenant=agent.tenant, run_id=run_id).order_by("seq")
    ]


def test_events_of_several_runs_take_two_statements_and_keep_each_runs_order(
    agent: Agent,
) -> None:
    events.emit_many(agent.tenant, "run-a", [event("tool_call_start", "a0")])  # a run's 1
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), events.gathered():
        assert events.emit_many(agent.tenant, "run-a", [event("tool_call_result", "a0")]) == []
        events.emit_many(agent.tenant, "run-b", [event("tool_call_start", "b0")])
        events.emit_many(agent.tenant, "run-a", [event("tool_call_start", "a1")])
        events.emit_many(
            agent.tenant,
            "run-b",
            [event("tool_call_result", "b0"), event("tool_call_start", "b1")],
        )
    assert len([q for q in queries.captured_queries if "INSERT" in q["sql"]]) == 2
    assert numbers(agent, "run-a") == [
        (1, "tool_call_start", "a0"),
        (2, "tool_call_result", "a0"),
        (3, "tool_call_start", "a1"),
    ]
    assert numbers(agent, "run-b") == [
        (1, "tool_call_start", "b0"),
        (2, "tool_call_result", "b0"),
        (3, "tool_call_start", "b1"),
    ]
    assert Run.objects.get(tenant=agent.tenant, run_id="run-a").last_seq == 3
    assert RunEvent.objects.get(run_id="run-b", seq=3).message["seq"] == 3


def test_a_gathered_block_that_fails_writes_none_of_its_events(agent: Agent) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(), events.gathered():
        events.emit_many(agent.tenant, "run-c", [event("tool_call_start", "c0")])
        raise RuntimeError("the transaction fails")
    assert numbers(agent, "run-c") == []
    assert not Run.objects.filter(run_id="run-c").exists()
    events.emit_many(agent.tenant, "run-c", [event("tool_call_start", "c1")])
    assert numbers(agent, "run-c") == [(1, "tool_call_start", "c1")]


def test_a_nested_gathered_block_leaves_the_writing_to_the_outer_one(agent: Agent) -> None:
    with transaction.atomic(), events.gathered():
        with events.gathered():
            events.emit_many(agent.tenant, "run-d", [event("tool_call_start", "d0")])
        assert numbers(agent, "run-d") == []  # not yet
    assert numbers(agent, "run-d") == [(1, "tool_call_start", "d0")]
