"""apps.invocations.inserts writes exactly the row Django's own INSERT writes (issue 13:
the call path's record and events skip Django's per-call statement compilation)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from apps.invocations import inserts
from apps.invocations.models import ErrorCode, InvocationRecord, RunEvent, Status
from apps.tools.models import Tool
from tests.conftest import Agent

pytestmark = pytest.mark.django_db


def record(agent: Agent, **fields) -> InvocationRecord:
    return InvocationRecord(
        tenant=agent.tenant,
        tool=Tool.objects.get(pk="core__get_current_time"),
        tool_ref="core__get_current_time",
        tool_call_id=f"call_{uuid.uuid4().hex}",
        run_id="run-inserts",
        principal=agent.principal,
        status=Status.FAILED,
        ok=False,
        args={"text": "é", "nested": [1, {"deep": None}]},
        args_shape={"text": "string[1]"},
        result=None,
        error_code=ErrorCode.VALIDATION,
        safe_message="Invalid arguments: text: too long",
        started_at=datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=UTC),
        ended_at=datetime(2026, 11, 23, 12, 0, 1, tzinfo=UTC),
        duration_ms=877,
        **fields,
    )


def stored(instance) -> dict:
    found = type(instance).objects.get(pk=instance.pk)
    row = model_to_dict(found)
    row.pop("id", None)
    for name in ("tool_call_id",):
        row.pop(name, None)
    return {**row, "created_at": found.created_at is not None}


def test_an_inserted_record_reads_back_as_djangos_save_writes_it(agent: Agent) -> None:
    by_django, by_insert = record(agent), record(agent)
    by_django.save(force_insert=True)
    with CaptureQueriesContext(connection) as queries:
        inserts.insert([by_insert])
    assert len(queries.captured_queries) == 1
    assert by_insert._state.adding is False and by_insert._state.db == "default"
    assert stored(by_insert) == stored(by_django)
    assert by_insert.created_at is not None  # auto_now_add, as Django's save sets it
    assert InvocationRecord.objects.get(pk=by_insert.pk).args == by_django.args


def test_several_events_go_in_one_statement_in_order(agent: Agent) -> None:
    rows = [
        RunEvent(
            tenant=agent.tenant,
            run_id="run-inserts",
            seq=seq,
            type="tool_call_start",
            tool_call_id="call-1",
            tool_id="core__get_current_time",
            message={"seq": seq, "x": "é"},
            at=datetime(2026, 11, 23, 12, 0, seq, tzinfo=UTC),
        )
        for seq in (1, 2, 3)
    ]
    with CaptureQueriesContext(connection) as queries:
        inserts.insert(rows)
    assert len(queries.captured_queries) == 1
    found = list(RunEvent.objects.filter(run_id="run-inserts").order_by("seq"))
    assert [(e.seq, e.message, e.at.second) for e in found] == [
        (1, {"seq": 1, "x": "é"}, 1),
        (2, {"seq": 2, "x": "é"}, 2),
        (3, {"seq": 3, "x": "é"}, 3),
    ]


def test_a_value_that_is_an_expression_goes_through_django(agent: Agent) -> None:
    row = record(agent, cancel_requested=False)
    row.ended_at = Now()
    inserts.insert([row])  # Django's bulk_create compiles the expression
    assert InvocationRecord.objects.get(pk=row.pk).ended_at is not None


def test_a_duplicate_key_fails_like_djangos_insert(agent: Agent) -> None:
    from django.db import IntegrityError, transaction

    first = record(agent)
    inserts.insert([first])
    again = record(agent)
    again.pk = first.pk
    with pytest.raises(IntegrityError), transaction.atomic():
        inserts.insert([again])
