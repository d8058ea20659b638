"""A migration operation that takes a foreign key's own index away without rebuilding
the table.

Django's `AlterField(db_index=False)` is right on PostgreSQL but on SQLite it copies the
whole table into a new one (its `_remake_table`), and the tables that carry these keys
(records, events) are the largest a deployment has. The index is redundant where another
index leads with the same column (tests/test_indexes.py), so only the index goes: the
state changes as `AlterField` would, and the database loses the column's plain indexes
(on PostgreSQL also the `varchar_pattern_ops` one Django adds for a text key). Going
back is Django's own `AlterField`, which puts them back.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.migrations.operations import AlterField


class DropFieldIndex(AlterField):
    """`AlterField` to a field with `db_index=False`; only the field's index is dropped."""

    def __init__(self, model_name: str, name: str, field: models.Field, **kwargs: Any) -> None:
        if getattr(field, "db_index", True):
            raise ValueError(f"DropFieldIndex({model_name}.{name}) needs db_index=False")
        super().__init__(model_name, name, field, **kwargs)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table, column = model._meta.db_table, model._meta.get_field(self.name).column
        # The names Django gave them (`_field_indexes_sql`, `_create_like_index_sql`):
        # exactly what AlterField would drop, nothing a model declares itself.
        own = {schema_editor._create_index_name(table, [column], suffix=s) for s in ("", "_like")}
        with schema_editor.connection.cursor() as cursor:
            found = schema_editor.connection.introspection.get_constraints(cursor, table)
        for index_name in sorted(own & set(found)):
            schema_editor.execute(schema_editor._delete_index_sql(model, index_name))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        # AlterField's own backwards calls database_forwards, which is this class's now.
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"Drop the index of field {self.name} on {self.model_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"drop_index_{self.model_name_lower}_{self.name_lower}"
