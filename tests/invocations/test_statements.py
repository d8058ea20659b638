"""apps.invocations.statements writes exactly the row Django's own INSERT writes (issue 13:
the call path's record and events skip Django's per-call statement compilation)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models.functions import Now
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from apps.invocations import statements
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
        statements.insert([by_insert])
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
        statements.insert(rows)
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
    statements.insert([row])  # Django's bulk_create compiles the expression
    assert InvocationRecord.objects.get(pk=row.pk).ended_at is not None


def test_a_duplicate_key_fails_like_djangos_insert(agent: Agent) -> None:
    from django.db import IntegrityError

    first = record(agent)
    statements.insert([first])
    again = record(agent)
    again.pk = first.pk
    with pytest.raises(IntegrityError), transaction.atomic():
        statements.insert([again])


def test_an_updated_record_reads_back_as_djangos_save_with_update_fields_writes_it(
    agent: Agent,
) -> None:
    from apps.invocations.runner import CLOSING_FIELDS

    by_django, by_update = record(agent), record(agent)
    for row in (by_django, by_update):
        row.status, row.ok, row.result, row.ended_at = Status.RUNNING, None, None, None
        statements.insert([row])
        row.status, row.ok, row.error_code, row.safe_message = Status.SUCCEEDED, True, "", ""
        row.result = {"answer": "é", "list": [1, None, {"x": 2.5}]}
        row.ended_at = datetime(2026, 11, 23, 12, 0, 2, 654321, tzinfo=UTC)
        row.duration_ms, row.retry_after_ms = 2531, None
        row.args = {"changed": "only in Python"}  # not a closing field: stays as inserted
    by_django.save(update_fields=CLOSING_FIELDS)
    with CaptureQueriesContext(connection) as queries:
        assert statements.update(by_update, CLOSING_FIELDS) is True
    assert len(queries.captured_queries) == 1
    assert queries.captured_queries[0]["sql"].startswith("UPDATE")
    assert stored(by_update) == stored(by_django)
    assert InvocationRecord.objects.get(pk=by_update.pk).args == {
        "text": "é",
        "nested": [1, {"deep": None}],
    }


def test_an_update_of_a_missing_row_fails_like_djangos_save(agent: Agent) -> None:
    from django.db import DatabaseError

    row = record(agent)
    statements.insert([row])
    InvocationRecord.objects.filter(pk=row.pk).delete()
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        statements.update(row, ("status",))


def test_a_guarded_update_changes_the_row_only_while_it_holds_the_guarded_values(
    agent: Agent,
) -> None:
    row = record(agent, cancel_requested=False)
    row.status = Status.PENDING_APPROVAL
    statements.insert([row])
    row.status = Status.RUNNING
    guard = {"status": Status.PENDING_APPROVAL}
    assert statements.update(row, ("status",), only_if=guard) is True
    assert InvocationRecord.objects.get(pk=row.pk).status == Status.RUNNING
    row.status = Status.CANCELLED  # the guard no longer holds: nothing is written
    assert statements.update(row, ("status",), only_if=guard) is False
    assert InvocationRecord.objects.get(pk=row.pk).status == Status.RUNNING


def test_an_expression_in_an_update_goes_through_django(agent: Agent) -> None:
    row = record(agent)
    statements.insert([row])
    row.ended_at = Now()
    assert statements.update(row, ("ended_at",)) is True
    ended = InvocationRecord.objects.get(pk=row.pk).ended_at
    assert ended is not None and ended.year >= 2026
    row.ended_at = Now()
    guard = {"status": Status.FAILED}
    assert statements.update(row, ("ended_at",), only_if=guard) is True
    assert statements.update(row, ("ended_at",), only_if={"status": Status.RUNNING}) is False


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared on PostgreSQL only")
def test_on_postgresql_a_calls_statements_are_prepared_once_and_then_not_planned(
    agent: Agent,
) -> None:
    """The statements every call sends with the same text (its record, its run's numbers,
    its events) are prepared on the connection (toolhub.db.postgresql.statement_cursor):
    parsed once, then run on their generic plan; values bound on the server."""

    def prepared() -> dict[str, tuple[int, int]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT statement, custom_plans + generic_plans, generic_plans "
                "FROM pg_prepared_statements"
            )
            rows = cursor.fetchall()
        assert all("%s" not in text for text, _, _ in rows)
        return {text: (runs, generic) for text, runs, generic in rows}

    def runs_of(found: dict[str, tuple[int, int]], prefix: str) -> tuple[int, int]:
        (runs,) = [runs for text, runs in found.items() if text.startswith(prefix)] or [(0, 0)]
        return runs

    agent.invoke("core__get_current_time", runId="run-prepared")  # the run's row exists
    before = prepared()
    with CaptureQueriesContext(connection) as queries:
        for _ in range(8):
            assert agent.invoke("core__get_current_time", runId="run-prepared").json()["ok"]
    after = prepared()
    # The record, its run's numbers and its events: one statement (apps.invocations.
    # combined), sent once per call.
    text = 'WITH i0 AS (INSERT INTO "invocations_invocationrecord"'
    runs, generic = runs_of(after, text)
    assert runs - runs_of(before, text)[0] == 8
    assert generic >= 3  # from the sixth run on, no planning
    # Django's query log still shows it, values quoted in.
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("WITH i0")]
    assert inserts and all("$1" not in sql and "%s" not in sql for sql in inserts)


def test_rows_updated_by_key_read_back_as_djangos_filtered_update_writes_them(
    agent: Agent,
) -> None:
    by_django = [record(agent) for _ in range(3)]
    by_keys = [record(agent) for _ in range(3)]
    statements.insert(by_django + by_keys)
    values = {"status": Status.SUCCEEDED, "result": {"answer": "é", "n": [1, None]}}
    InvocationRecord.objects.filter(pk__in=[r.pk for r in by_django[:2]]).update(**values)
    with CaptureQueriesContext(connection) as queries:
        assert (
            statements.update_rows(InvocationRecord, [str(r.pk) for r in by_keys[:2]], values) == 2
        )
    assert len(queries.captured_queries) == 1
    assert [stored(r) for r in by_keys] == [stored(r) for r in by_django]
    untouched = InvocationRecord.objects.get(pk=by_keys[2].pk)
    assert (untouched.status, untouched.result) == (Status.FAILED, None)


def test_rows_updated_by_key_count_only_the_rows_there_and_take_no_keys_quietly(
    agent: Agent,
) -> None:
    rows = [record(agent) for _ in range(2)]
    statements.insert(rows)
    gone = uuid.uuid4()
    assert statements.update_rows(InvocationRecord, [rows[0].pk, gone], {"duration_ms": 5}) == 1
    assert InvocationRecord.objects.get(pk=rows[0].pk).duration_ms == 5
    with CaptureQueriesContext(connection) as queries:
        assert statements.update_rows(InvocationRecord, [], {"duration_ms": 6}) == 0
    assert queries.captured_queries == []
    assert InvocationRecord.objects.get(pk=rows[1].pk).duration_ms == 877
    # Another number of keys is another statement, not the first one's text.
    assert statements.update_rows(InvocationRecord, [r.pk for r in rows], {"duration_ms": 7}) == 2
    assert set(InvocationRecord.objects.values_list("duration_ms", flat=True)) == {7}


def test_an_expression_in_rows_updated_by_key_goes_through_django(agent: Agent) -> None:
    rows = [record(agent) for _ in range(2)]
    statements.insert(rows)
    assert statements.update_rows(InvocationRecord, [r.pk for r in rows], {"ended_at": Now()}) == 2
    assert all(
        ended is not None and ended.year >= 2026 and ended != rows[0].ended_at
        for ended in InvocationRecord.objects.values_list("ended_at", flat=True)
    )
    with pytest.raises(ValidationError, match="not a valid UUID"):  # as Django's filter
        statements.update_rows(InvocationRecord, ["not-a-key"], {"duration_ms": 1})


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared on PostgreSQL only")
@pytest.mark.django_db(transaction=True)  # it closes the connection
def test_on_postgresql_a_connection_keeps_one_statement_cursor_while_it_is_free(
    agent: Agent,
) -> None:
    """toolhub.db.postgresql's prepared cursor is kept per connection and reused once a
    statement is done with it; one asked for while it is in use is another, closed as
    usual; a new connection gets its own; a failed statement frees it too."""
    from django.db import DatabaseError

    from toolhub.db.postgresql import statement_cursor

    def one(sql: str, params: list) -> tuple:
        with statement_cursor(connection) as cursor:  # Django's wrapper of psycopg's
            cursor.execute(sql, params)
            return cursor.cursor, cursor.fetchone()

    first, row = one("SELECT %s::int + 1", [1])
    again, row2 = one("SELECT %s::int + 1", [2])
    assert (row, row2) == ((2,), (3,)) and again is first and not first.closed
    with statement_cursor(connection) as cursor:
        cursor.execute("SELECT generate_series(1, %s::int)", [3])
        inner, inner_row = one("SELECT %s::text", ["inner"])  # while the kept one is read
        assert inner is not first and inner.closed and inner_row == ("inner",)
        assert cursor.fetchall() == [(1,), (2,), (3,)]
    with pytest.raises(DatabaseError), transaction.atomic():
        one("SELECT 1 / %s::int", [0])
    assert one("SELECT %s::int * 2", [21]) == (first, (42,))
    previous = first.connection
    connection.close()
    renewed, renewed_row = one("SELECT %s::int", [5])
    assert renewed_row == (5,) and renewed.connection is connection.connection
    # The pool may hand the same psycopg connection back (it did after other tests had
    # left one idle connection): its kept cursor is then still its own.
    assert (renewed is first) == (connection.connection is previous)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared on PostgreSQL only")
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_long_statement_is_converted_once_and_bound_anew_each_time(
    agent: Agent,
) -> None:
    """The prepared cursor keeps the conversion of a text (placeholders to `$n`) even past
    psycopg's own limits (4 KiB, 50 values), as a worker's start of several calls is;
    each execution still binds its own values, and a literal `%%` stays a `%`."""
    from toolhub.db.postgresql import base, statement_cursor

    count = 80
    sql = "SELECT '100%%', " + " + ".join(["%s::int"] * count) + " -- " + "x" * 4096
    assert len(sql) > 4096
    base._converted.cache_clear()
    answers = []
    for offset in range(3):
        with statement_cursor(connection) as cursor:
            cursor.execute(sql, [n + offset for n in range(count)])
            answers.append(cursor.fetchone())
    assert answers == [("100%", sum(range(count)) + offset * count) for offset in range(3)]
    converted = base._converted.cache_info()
    assert (converted.misses, converted.hits) == (1, 2)
    with statement_cursor(connection) as cursor:  # a text without values: psycopg's own
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    assert base._converted.cache_info().misses == 1
