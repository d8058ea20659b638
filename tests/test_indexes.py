"""No index of ours repeats another on the same table.

Every index is written again on each insert and on each update that is not a HOT one
(an approval's status changes twice per call): an index whose columns lead another's
costs those writes for no lookup the other cannot serve. Django adds one per foreign
key, and on PostgreSQL a second one (`varchar_pattern_ops`, for `LIKE 'x%'`) per
indexed character column, so a model says `db_index=False` where a composite index or
constraint already leads with the key (issue 13).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from toolhub.db.index_ops import DropFieldIndex

pytestmark = pytest.mark.django_db


def _our_tables() -> list[str]:
    """Our models' tables. Not the many-to-many tables Django makes itself (a policy's
    tools, a tenant's members): their key index and their unique pair are Django's
    choice, and they are written only when an admin edits one."""
    return sorted(
        model._meta.db_table
        for config in apps.get_app_configs()
        if config.name.startswith("apps.")
        for model in config.get_models()
        if model._meta.managed and not model._meta.proxy
    )


def _indexes(table: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {name: info for name, info in found.items() if info["index"] or info["unique"]}


def redundant_indexes(table: str) -> list[str]:
    """Plain indexes (not unique, not partial) whose columns lead another index's. An
    index with an operator class of its own (PostgreSQL's `varchar_pattern_ops`, which
    serves `LIKE 'x%'`) answers other queries than a plain one on the same columns."""
    indexes = _indexes(table)
    partial = _indexes_defined_with(table, " WHERE ")
    own_operators = _indexes_defined_with(table, "_pattern_ops")
    redundant = []
    for name, info in indexes.items():
        if info["unique"] or info["primary_key"] or name in partial | own_operators:
            continue
        columns = info["columns"]
        for other_name, other in indexes.items():
            if other_name == name or other_name in partial:
                continue
            if other["columns"][: len(columns)] == columns:
                redundant.append(f"{table}.{name} {columns} (led by {other_name})")
                break
    return redundant


def _indexes_defined_with(table: str, words: str) -> set[str]:
    """The table's indexes whose definition holds `words` (a WHERE clause, an operator
    class): Django's introspection reports neither."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
                [table, f"%{words}%"],
            )
        else:
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s "
                "AND sql LIKE %s",
                [table, f"%{words}%"],
            )
        return {row[0] for row in cursor.fetchall()}


def test_no_index_repeats_another():
    tables = _our_tables()
    assert "approvals_approvalrequest" in tables and "invocations_runevent" in tables
    found = [line for table in tables for line in redundant_indexes(table)]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_repeated_index():
    """The check itself: an index that repeats the head of another is reported."""
    from apps.invocations.models import RunEvent

    table = RunEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX probe_repeat ON {table} (tenant_id, run_id)")
    try:
        assert any("probe_repeat" in line for line in redundant_indexes(table))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX probe_repeat")


def test_a_partial_index_is_not_a_stand_in():
    from apps.invocations.models import RunEvent

    table = RunEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX probe_partial ON {table} (tenant_id, type) WHERE seq > 5")
        cursor.execute(f"CREATE INDEX probe_plain ON {table} (type)")
    try:
        lines = redundant_indexes(table)
        assert not any("probe_plain" in line for line in lines)
        assert not any("probe_partial" in line for line in lines)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX probe_partial")
            cursor.execute("DROP INDEX probe_plain")


# Each app's migration that dropped the indexes, and the one before it.
DROPPED_IN = {
    "approvals": ("0001_initial", "0002_redundant_indexes"),
    "connections": ("0001_initial", "0002_redundant_indexes"),
    "invocations": ("0004_stream_ticket_session", "0005_redundant_indexes"),
    "mcp": ("0001_servers_and_imported_tools", "0002_redundant_indexes"),
    "planning": ("0001_initial", "0002_redundant_indexes"),
    "policies": ("0001_initial", "0002_redundant_indexes"),
    "tenants": ("0005_split_service_users", "0006_membership_redundant_index"),
}


def _storage(table: str) -> int:
    """Where the table's rows are stored: a table rebuilt (copied into a new one and
    renamed, SQLite's way to alter a column) is stored somewhere else."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_relation_filenode(%s)", [table])
        else:
            cursor.execute("SELECT rootpage FROM sqlite_master WHERE name = %s", [table])
        return int(cursor.fetchone()[0])


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_the_migrations_drop_the_indexes_and_keep_the_rows():
    """Back to before the drop: the foreign keys' own indexes are there again (Django's
    AlterField). Forward: they are gone, with no table rebuilt, and every row kept."""
    from apps.invocations.models import InvocationRecord, RunEvent
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.create(slug="idx", name="Indexes")
    RunEvent.objects.create(
        tenant=tenant, run_id="r", seq=1, type="t", tool_call_id="c", tool_id="x",
        message={"a": 1}, at="2026-11-27T00:00:00Z",
    )  # fmt: skip
    record_table = InvocationRecord._meta.db_table
    event_table = RunEvent._meta.db_table
    with connection.schema_editor() as editor:
        tenant_index = editor._create_index_name(record_table, ["tenant_id"], suffix="")
        event_index = editor._create_index_name(event_table, ["tenant_id"], suffix="")
    try:
        _migrate([(app, before) for app, (before, _after) in DROPPED_IN.items()])
        assert tenant_index in _indexes(record_table)
        assert event_index in _indexes(event_table)
        assert RunEvent.objects.filter(tenant=tenant, seq=1).count() == 1
        stored = _storage(event_table), _storage(record_table)
        _migrate([(app, after) for app, (_before, after) in DROPPED_IN.items()])
        assert tenant_index not in _indexes(record_table)
        assert event_index not in _indexes(event_table)
        assert RunEvent.objects.get(tenant=tenant, seq=1).message == {"a": 1}
        assert (_storage(event_table), _storage(record_table)) == stored  # not rebuilt
    finally:
        executor = MigrationExecutor(connection)
        _migrate(executor.loader.graph.leaf_nodes())
    assert [line for table in _our_tables() for line in redundant_indexes(table)] == []


def test_drop_field_index_takes_only_an_unindexed_field():
    from django.db import models

    with pytest.raises(ValueError, match="db_index=False"):
        DropFieldIndex("runevent", "tenant", models.ForeignKey("tenants.Tenant", models.CASCADE))
