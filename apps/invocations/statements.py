"""The call path's writes, with statements built once.

Every call inserts its record and its events, and a call recorded before it ran (a side
effect, an approved call) updates its record once or twice more. Django's `save()`,
`bulk_create()` and `QuerySet.update()` compile their statement anew each time (quoting
names, asking each field for a placeholder): a measurable part of a call (issue 13).
`insert()` and `update()` build theirs once per model, database and shape, and ask each
field for what Django itself would send (`pre_save`, then `get_db_prep_save`). They cover
plain fields only: a field with a placeholder of its own, an expression as a value, or
an auto-incremented key the caller needs back go through Django. They send no
`pre_save`/`post_save` signals: use them only for models that have no receivers (the
invocations app's records and events, an approval's claim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, models

from toolhub.db.postgresql import statement_cursor

_statements: dict[tuple[type[models.Model], str, int], str] = {}
_updates: dict[tuple[type[models.Model], str, tuple[str, ...], tuple[str, ...]], _Update] = {}
_in_statements: dict[tuple[type[models.Model], str, tuple[str, ...], int], str] = {}


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
    built = insert_sql(rows, using)
    if built is None:
        type(rows[0]).objects.using(using).bulk_create(rows)  # Django compiles what this cannot
        return
    with statement_cursor(connections[using]) as cursor:
        cursor.execute(*built)
    inserted(rows, using)


def insert_sql(rows: list[Any], using: str = "default") -> tuple[str, list[Any]] | None:
    """The statement `insert()` sends and its parameters, or None for rows only Django's
    own insert can write (see the module docstring). Call `inserted()` once it is sent."""
    model = type(rows[0])
    fields = _columns(model)
    values = [field.pre_save(row, add=True) for row in rows for field in fields]
    if not _plain(fields) or any(hasattr(value, "resolve_expression") for value in values):
        return None
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
    return sql, params


def inserted(rows: list[Any], using: str = "default") -> None:
    """These rows are written: saved instances from now on, as Django's insert leaves them."""
    for row in rows:
        row._state.adding = False
        row._state.db = using


def update(row: Any, fields: tuple[str, ...], *, only_if: dict[str, Any] | None = None) -> bool:
    """UPDATE these fields of a saved row, found by its key, with its current values: what
    `row.save(update_fields=fields)` writes. With `only_if` (field name -> value, each
    compared with `=`) the row is updated only when it still holds those values, and the
    answer says whether it did (a claim: approved -> executing). Without it a missing row
    fails as Django's save does."""
    built = update_sql(row, fields, only_if=only_if)
    if built is None:
        return _django_update(row, fields, only_if)
    sql, params = built
    with statement_cursor(connections[row._state.db or "default"]) as cursor:
        cursor.execute(sql, params)
        changed = cursor.rowcount
    if not changed and only_if is None:
        raise DatabaseError("Save with update_fields did not affect any rows.")
    return bool(changed)


def update_rows(
    model: type[models.Model], pks: list[Any], values: dict[str, Any], using: str = "default"
) -> int:
    """Set these fields to these values on the rows with these keys, in one statement whose
    text is built once per model, database, fields and number of rows: what
    `model.objects.filter(pk__in=pks).update(**values)` writes (no signals either), without
    compiling it each time (a worker's batch ends with it, issue 13). How many rows it
    changed. Values Django would write otherwise (an expression, a field with a
    placeholder of its own) go through Django's update."""
    if not pks:
        return 0
    connection = connections[using]
    fields = tuple(values)
    shape = _update(model, connection, fields, ())
    pk = model._meta.pk
    assert pk is not None
    params = [
        field.get_db_prep_save(value, connection=connection)
        for field, value in zip(shape.targets, values.values(), strict=True)
    ]
    if not shape.plain or any(
        hasattr(value, "resolve_expression") or hasattr(value, "as_sql") for value in params
    ):
        return int(model._base_manager.using(using).filter(pk__in=pks).update(**values))
    key = (model, using, fields, len(pks))
    sql = _in_statements.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sql = _in_statements[key] = (
            f"UPDATE {quote(model._meta.db_table)} SET "  # noqa: S608 (names, not values)
            + ", ".join(f"{quote(str(field.column))} = %s" for field in shape.targets)
            + f" WHERE {quote(str(pk.column))} IN ({', '.join(['%s'] * len(pks))})"
        )
    params += [pk.get_db_prep_value(value, connection=connection, prepared=False) for value in pks]
    with statement_cursor(connection) as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


@dataclass(frozen=True)
class _Update:
    """An UPDATE's text and what its parameters need, per model, database and shape."""

    targets: list[models.Field[Any, Any]]  # the SET fields, in order
    guards: list[models.Field[Any, Any]]  # the `only_if` fields, in order
    plain: bool  # no field with a placeholder of its own (else Django's update)
    sql: str


def _update(
    model: type[models.Model], connection: Any, fields: tuple[str, ...], only_if: tuple[str, ...]
) -> _Update:
    key = (model, connection.alias, fields, only_if)
    found = _updates.get(key)
    if found is None:
        meta = model._meta
        targets = [meta.get_field(name) for name in fields]
        guards = [meta.get_field(name) for name in only_if]
        quote = connection.ops.quote_name
        assert meta.pk is not None
        where = [meta.pk, *guards]
        found = _updates[key] = _Update(
            targets=targets,  # type: ignore[arg-type]
            guards=guards,  # type: ignore[arg-type]
            plain=_plain(targets),  # type: ignore[arg-type]
            sql=(
                f"UPDATE {quote(meta.db_table)} SET "  # noqa: S608 (names, not values)
                + ", ".join(f"{quote(str(field.column))} = %s" for field in targets)  # type: ignore[union-attr]
                + " WHERE "
                + " AND ".join(f"{quote(str(field.column))} = %s" for field in where)  # type: ignore[union-attr]
            ),
        )
    return found


def update_sql(
    row: Any, fields: tuple[str, ...], *, only_if: dict[str, Any] | None = None
) -> tuple[str, list[Any]] | None:
    """The statement `update()` sends and its parameters, or None for a row only Django's
    own update can write (see the module docstring)."""
    model = type(row)
    connection = connections[row._state.db or "default"]
    shape = _update(model, connection, fields, tuple(only_if or ()))
    if not shape.plain:
        return None
    values = [field.pre_save(row, add=False) for field in shape.targets]
    if any(hasattr(value, "resolve_expression") for value in values):
        return None
    params = [
        field.get_db_prep_save(value, connection=connection)
        for field, value in zip(shape.targets, values, strict=True)
    ]
    if any(hasattr(value, "as_sql") for value in params):
        return None
    pk = model._meta.pk
    assert pk is not None
    params.append(pk.get_db_prep_value(row.pk, connection=connection, prepared=False))
    for field, value in zip(shape.guards, (only_if or {}).values(), strict=True):
        params.append(field.get_db_prep_value(value, connection=connection, prepared=False))
    return shape.sql, params


class Guarded:
    """Set these values on a saved row only while it still holds others (a claim:
    approved -> executing). Called, it writes on its own and answers whether it applied,
    the row's attributes back as they were if not; `apps.invocations.combined` sends the
    same UPDATE inside a larger statement."""

    def __init__(self, row: Any, values: dict[str, Any], only_if: dict[str, Any]) -> None:
        self.row, self.values, self.only_if = row, values, only_if
        self.fields = tuple(values)
        self._before = {name: getattr(row, name) for name in values}

    def apply(self) -> None:
        for name, value in self.values.items():
            setattr(self.row, name, value)

    def undo(self) -> None:
        for name, value in self._before.items():
            setattr(self.row, name, value)

    def __call__(self) -> bool:
        self.apply()
        applied = update(self.row, self.fields, only_if=self.only_if)
        if not applied:
            self.undo()
        return applied


def _django_update(row: Any, fields: tuple[str, ...], only_if: dict[str, Any] | None) -> bool:
    if only_if is None:
        row.save(update_fields=list(fields))
        return True
    changed = (
        type(row)
        ._base_manager.using(row._state.db or "default")
        .filter(pk=row.pk, **only_if)
        .update(**{name: getattr(row, name) for name in fields})
    )
    return bool(changed)
