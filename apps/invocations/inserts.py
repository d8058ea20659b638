"""New rows of the call path's own tables, written with a statement built once.

Every call inserts its record and its events. Django's `save()` and `bulk_create()`
compile the INSERT anew each time (quoting names, asking each field for a placeholder):
a measurable part of a no-op call (issue 13). `insert()` builds the statement once per
model, database and row count, and asks each field for what Django itself would send
(`pre_save(add=True)`, then `get_db_prep_save`). It covers plain fields only: a field
with a placeholder of its own, an expression as a value, or an auto-incremented key
the caller needs back go through Django. It sends no `pre_save`/`post_save` signals:
use it only for models that have no receivers (the invocations app's records and
events).
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models

_statements: dict[tuple[type[models.Model], str, int], str] = {}


def _columns(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """The fields an INSERT writes: every concrete one but an auto-incremented key."""
    return [
        field
        for field in model._meta.local_concrete_fields
        if not (field.primary_key and getattr(field, "db_returning", False))
    ]


def _plain(fields: list[models.Field[Any, Any]]) -> bool:
    return not any(getattr(field, "get_placeholder_sql", None) for field in fields)


def insert(rows: list[Any], using: str = "default") -> None:
    """INSERT these unsaved instances of one model in one statement."""
    model = type(rows[0])
    fields = _columns(model)
    values = [field.pre_save(row, add=True) for row in rows for field in fields]
    if not _plain(fields) or any(hasattr(value, "resolve_expression") for value in values):
        model.objects.using(using).bulk_create(rows)  # Django compiles what this cannot
        return
    connection = connections[using]
    key = (model, using, len(rows))
    sql = _statements.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = _statements[key] = (
            f"INSERT INTO {quote(model._meta.db_table)} "  # noqa: S608 (names, not values)
            f"({', '.join(quote(str(field.column)) for field in fields)}) "
            f"VALUES {', '.join([row] * len(rows))}"
        )
    params = [
        field.get_db_prep_save(value, connection=connection)
        for value, field in zip(values, fields * len(rows), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    for row in rows:
        row._state.adding = False
        row._state.db = using
