"""On PostgreSQL a call's own writes are one statement each (apps.invocations.combined,
runner._written_together; issue 13): a quick call's record with both its events, a call
recorded before it runs its start (record and tool_call_start) and then its end (the
record's closing columns and tool_call_result). Sent one by one each was BEGIN, three
statements and COMMIT. They must write what the statements one by one write, fail as a
whole, and keep an idempotency key's claim."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.invocations import combined, runner
from apps.invocations.models import InvocationRecord, Run, RunEvent
from tests.conftest import Agent
from tests.support.runs import take_next_number

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="one statement on PostgreSQL only"
)

PLAN = {"objective": "o", "initial_steps": ["a"]}
RECORD_FIELDS = ("status", "ok", "args", "args_shape", "error_code", "safe_message")


def sent(queries: CaptureQueriesContext) -> list[str]:
    """The call's statements that write (a key's last use is written at most once a
    minute), first words only."""
    found = []
    for query in queries.captured_queries:
        sql = query["sql"]
        if "tenants_apikey" in sql:
            continue
        if sql.split()[0] in ("INSERT", "UPDATE", "DELETE", "WITH"):
            found.append(sql)
    return found


def left_behind(agent: Agent, run_id: str) -> dict[str, Any]:
    """What a run's calls wrote, without ids, times and the run's name."""
    records = InvocationRecord.objects.filter(tenant=agent.tenant, run_id=run_id)
    stored = RunEvent.objects.filter(tenant=agent.tenant, run_id=run_id).order_by("seq")
    return {
        "records": [
            {name: getattr(record, name) for name in RECORD_FIELDS}
            | {
                "timed": record.started_at is not None and record.ended_at is not None,
                "result": sorted(record.result) if isinstance(record.result, dict) else None,
            }
            for record in records.order_by("started_at")
        ],
        "events": [
            (
                row.seq,
                row.type,
                row.tool_id,
                row.message["seq"],
                row.message["runId"] == run_id,
                row.message.get("invocationId") in {str(r.pk) for r in records},
                sorted(set(row.message) - {"at", "runId", "invocationId", "durationMs"}),
            )
            for row in stored
        ],
        "counter": Run.objects.get(tenant=agent.tenant, run_id=run_id).last_seq,
    }


def three_calls(agent: Agent, run_id: str) -> None:
    """A quick call, a call recorded before it runs, a refused one."""
    assert agent.invoke("core__get_current_time", runId=run_id).json()["ok"] is True
    body = agent.invoke("core__planning_setup_plan", runId=run_id, args=PLAN).json()
    assert body["ok"] is True
    refused = agent.invoke("core__get_current_time", runId=run_id, args={"x": 1}).json()
    assert refused["errorCode"] == "validation"


def not_seen_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the call's look in the ledger (step 6) finds nothing, as if the first
    call had not written its entry yet; the key is still computed and claimed later."""
    look = runner.find_replay

    def racing(call: runner.Call) -> Any:
        with monkeypatch.context() as patch:
            patch.setattr(runner.ledger, "find", lambda tenant, key: None)
            return look(call)

    monkeypatch.setattr(runner, "find_replay", racing)


@pytest.mark.django_db(transaction=True)
def test_each_of_a_calls_writes_is_one_statement(agent: Agent) -> None:
    agent.invoke("core__get_current_time", runId="run-one")  # the run's row exists
    with CaptureQueriesContext(connection) as queries:
        agent.invoke("core__get_current_time", runId="run-one")
    (quick,) = sent(queries)
    assert quick.startswith('WITH i0 AS (INSERT INTO "invocations_invocationrecord"')
    assert 'INSERT INTO "invocations_runevent"' in quick

    with CaptureQueriesContext(connection) as queries:
        agent.invoke("core__planning_setup_plan", runId="run-one", args=PLAN)
    start, end = [sql for sql in sent(queries) if "invocations_invocationrecord" in sql]
    assert start.startswith('WITH i0 AS (INSERT INTO "invocations_invocationrecord"')
    assert end.startswith("WITH claimed AS (SELECT 0 AS k WHERE false), u0 AS (UPDATE")
    # No event is numbered or written on its own, no record written by Django's own
    # statements, no transaction of its own.
    everything = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in everything if sql.startswith('INSERT INTO "invocations_run')]
    assert not [sql for sql in everything if sql.startswith('UPDATE "invocations_invocation')]
    assert not [sql for sql in everything if sql.startswith("SAVEPOINT")]


@pytest.mark.django_db(transaction=True)
def test_one_statement_writes_what_the_statements_one_by_one_write(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    three_calls(agent, "run-together")
    monkeypatch.setattr(combined, "available", lambda using="default": False)
    three_calls(agent, "run-apart")
    together, apart = left_behind(agent, "run-together"), left_behind(agent, "run-apart")
    assert together == apart
    assert [event[1] for event in together["events"]] == [
        "tool_call_start",
        "tool_call_result",
    ] * 3
    assert together["counter"] == 6
    assert [record["status"] for record in together["records"]] == [
        "succeeded",
        "succeeded",
        "failed",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_key_claimed_meanwhile_writes_nothing_and_answers_with_the_first_call(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests with one key: the second passed the ledger's look before the first
    wrote its record, so its start's statement meets the claimed key. Nothing of it stays
    (no record, no event, no number) and it answers with the first call's outcome."""
    first = agent.invoke("core__planning_setup_plan", runId="run-k", args=PLAN, idempotencyKey="k")
    assert first.json()["ok"] is True
    before = left_behind(agent, "run-k")
    not_seen_yet(monkeypatch)

    again = agent.invoke("core__planning_setup_plan", runId="run-k", args=PLAN, idempotencyKey="k")

    assert again.json()["invocationId"] == first.json()["invocationId"]
    assert again.json()["ok"] is True
    assert left_behind(agent, "run-k") == before
    assert InvocationRecord.objects.filter(tenant=agent.tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_statement_loses_nothing(agent: Agent) -> None:
    """The quick call's statement fails inside PostgreSQL (its start's number is taken by
    a row written behind the counter's back): neither the record nor any event nor a
    number stays, and the next call, once the row is gone, is numbered as if it never
    happened."""
    agent.invoke("core__get_current_time", runId="run-f")
    run = Run.objects.get(tenant=agent.tenant, run_id="run-f")
    squatter = take_next_number(agent.tenant, "run-f", run.created_at)
    taken = squatter.seq
    records = InvocationRecord.objects.count()
    with pytest.raises(IntegrityError):
        agent.invoke("core__get_current_time", runId="run-f", toolCallId="call-f")
    assert InvocationRecord.objects.count() == records
    assert not InvocationRecord.objects.filter(tool_call_id="call-f").exists()
    assert Run.objects.get(tenant=agent.tenant, run_id="run-f").last_seq == taken - 1
    assert not RunEvent.objects.filter(tool_call_id="call-f").exists()

    squatter.delete()
    assert agent.invoke("core__get_current_time", runId="run-f").json()["ok"] is True
    numbers = list(
        RunEvent.objects.filter(run_id="run-f").order_by("seq").values_list("seq", flat=True)
    )
    assert numbers == [1, 2, 3, 4]


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_a_claimed_key_leaves_it_usable(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made inside a transaction of its caller's (a test's, a script's): the
    start's statement runs in a savepoint, so a claimed key fails only it."""
    first = agent.invoke("core__planning_setup_plan", runId="run-t", args=PLAN, idempotencyKey="t")
    not_seen_yet(monkeypatch)
    with transaction.atomic():
        again = agent.invoke(
            "core__planning_setup_plan", runId="run-t", args=PLAN, idempotencyKey="t"
        )
        assert again.json()["invocationId"] == first.json()["invocationId"]
        body = agent.invoke("core__get_current_time", runId="run-t").json()  # still usable
    assert InvocationRecord.objects.filter(pk=body["invocationId"]).exists()
    assert [e.type for e in RunEvent.objects.filter(run_id="run-t").order_by("seq")] == [
        "tool_call_start",
        "tool_call_result",
    ] * 2
