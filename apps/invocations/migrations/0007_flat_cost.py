"""Calls counted as they end (issue 45): the CallEnd queue, filled by triggers on the
records table in the statement that ends a record, and the rollups the sweeper folds it
into (CallTotal for /metrics, CallMinute for the overview); partial indexes for what the
sweeper reads, so an idle pass reads no history. Records already final are counted here.
"""

from datetime import timedelta
from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Count, Q, Sum
from django.utils import timezone

FINAL = "('succeeded', 'failed', 'cancelled')"
RECORDS = "invocations_invocationrecord"
COLUMNS = (
    "sign, record_id, tenant_id, run_id, tool_call_id, tool_ref, principal, status, "
    "error_code, ended_at, duration_ms"
)
# What a call's count depends on: a change of one of these in a final record moves it.
COUNTED = ("status", "tenant_id", "tool_ref", "principal", "error_code", "ended_at", "duration_ms")


def _values(sign: int, row: str) -> str:
    names = ("id", "tenant_id", "run_id", "tool_call_id", "tool_ref", "principal", "status")
    rest = ("error_code", "ended_at", "duration_ms")
    return ", ".join([str(sign), *(f"{row}.{name}" for name in (*names, *rest))])


SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER invocations_call_ended AFTER INSERT ON {RECORDS}
    WHEN NEW.status IN {FINAL}
    BEGIN
        INSERT INTO invocations_callend ({COLUMNS}) VALUES ({_values(1, "NEW")});
    END""",  # noqa: S608 (names, not values)
    f"""CREATE TRIGGER invocations_call_changed AFTER UPDATE ON {RECORDS}
    WHEN (OLD.status IN {FINAL} OR NEW.status IN {FINAL})
        AND ({" OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in COUNTED)})
    BEGIN
        INSERT INTO invocations_callend ({COLUMNS})
            SELECT {_values(-1, "OLD")} WHERE OLD.status IN {FINAL};
        INSERT INTO invocations_callend ({COLUMNS})
            SELECT {_values(1, "NEW")} WHERE NEW.status IN {FINAL};
    END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS invocations_call_ended",
    "DROP TRIGGER IF EXISTS invocations_call_changed",
]
POSTGRESQL_TRIGGERS = [
    f"""CREATE FUNCTION invocations_note_call_end() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.status IN {FINAL} THEN
            INSERT INTO invocations_callend ({COLUMNS}) VALUES ({_values(-1, "OLD")});
        END IF;
        IF NEW.status IN {FINAL} THEN
            INSERT INTO invocations_callend ({COLUMNS}) VALUES ({_values(1, "NEW")});
        END IF;
        RETURN NULL;
    END $$""",  # noqa: S608 (names, not values)
    f"""CREATE TRIGGER invocations_call_ended AFTER INSERT ON {RECORDS}
    FOR EACH ROW WHEN (NEW.status IN {FINAL}) EXECUTE FUNCTION invocations_note_call_end()""",
    f"""CREATE TRIGGER invocations_call_changed AFTER UPDATE ON {RECORDS}
    FOR EACH ROW WHEN (
        (OLD.status IN {FINAL} OR NEW.status IN {FINAL})
        AND ({", ".join(f"OLD.{c}" for c in COUNTED)})
            IS DISTINCT FROM ({", ".join(f"NEW.{c}" for c in COUNTED)})
    ) EXECUTE FUNCTION invocations_note_call_end()""",
]
POSTGRESQL_DROP = [
    f"DROP TRIGGER IF EXISTS invocations_call_ended ON {RECORDS}",
    f"DROP TRIGGER IF EXISTS invocations_call_changed ON {RECORDS}",
    "DROP FUNCTION IF EXISTS invocations_note_call_end()",
]
# The sweeper's end_dead_entries and its lease check read the RUNNING queue entries,
# a handful, from a table that keeps every finished one (django-tasks-db's own partial
# index covers READY only).
TASKS = "django_tasks_database_dbtaskresult"
RUNNING_ENTRIES = (
    f"CREATE INDEX invocations_running_tasks_idx ON {TASKS} (started_at) WHERE status = 'RUNNING'"
)


def _run(statements: list[str], schema_editor: Any) -> None:
    for statement in statements:
        schema_editor.execute(statement)


def add_triggers(apps: Any, schema_editor: Any) -> None:
    postgresql = schema_editor.connection.vendor == "postgresql"
    _run(POSTGRESQL_TRIGGERS if postgresql else SQLITE_TRIGGERS, schema_editor)


def drop_triggers(apps: Any, schema_editor: Any) -> None:
    postgresql = schema_editor.connection.vendor == "postgresql"
    _run(POSTGRESQL_DROP if postgresql else SQLITE_DROP, schema_editor)


BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
RECENT = timedelta(hours=1)


def count_history(apps: Any, schema_editor: Any) -> None:
    """The records written before the triggers: totals from one grouped query; those of
    the last hour go through the queue instead (the overview's minutes, the sweeper's
    result check)."""
    record_model = apps.get_model("invocations", "InvocationRecord")
    total_model = apps.get_model("invocations", "CallTotal")
    end_model = apps.get_model("invocations", "CallEnd")
    using = schema_editor.connection.alias
    final = record_model.objects.using(using).filter(
        status__in=["succeeded", "failed", "cancelled"]
    )
    recent = timezone.now() - RECENT
    timed = Q(duration_ms__isnull=False)
    buckets = {
        f"le_{n}": Count("pk", filter=Q(duration_ms__lte=bound))
        for n, bound in enumerate(BOUNDS_MS)
    }
    rows = (
        final.exclude(ended_at__gte=recent)
        .values("tenant_id", "tool_ref", "status")
        .annotate(
            calls=Count("pk"),
            timed=Count("pk", filter=timed),
            sum_ms=Sum("duration_ms", filter=timed),
            **buckets,
        )
        .order_by()
    )
    total_model.objects.using(using).bulk_create(
        [
            total_model(
                tenant_id=row["tenant_id"],
                tool_ref=row["tool_ref"],
                status=row["status"],
                calls=row["calls"],
                timed=row["timed"],
                sum_ms=row["sum_ms"] or 0,
                buckets=[row[f"le_{n}"] for n in range(len(BOUNDS_MS))],
            )
            for row in rows.iterator()
        ],
        batch_size=500,
    )
    end_model.objects.using(using).bulk_create(
        [
            end_model(
                record_id=record.pk,
                tenant_id=record.tenant_id,
                run_id=record.run_id,
                tool_call_id=record.tool_call_id,
                tool_ref=record.tool_ref,
                principal=record.principal,
                status=record.status,
                error_code=record.error_code,
                ended_at=record.ended_at,
                duration_ms=record.duration_ms,
            )
            for record in final.filter(ended_at__gte=recent).iterator()
        ],
        batch_size=500,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("invocations", "0006_traceparent"),
        ("tenants", "0001_initial"),
        ("django_tasks_database", "0021_conditional_partial_index_ordering"),
    ]

    operations = [
        migrations.CreateModel(
            name="CallEnd",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("sign", models.SmallIntegerField(default=1)),
                ("record_id", models.UUIDField()),
                ("run_id", models.CharField(max_length=128)),
                ("tool_call_id", models.CharField(max_length=128)),
                ("tool_ref", models.CharField(max_length=200)),
                ("principal", models.CharField(max_length=160)),
                ("status", models.CharField(max_length=20)),
                ("error_code", models.CharField(blank=True, max_length=24)),
                ("ended_at", models.DateTimeField(null=True)),
                ("duration_ms", models.PositiveIntegerField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name="CallMinute",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("tool_ref", models.CharField(max_length=200)),
                ("status", models.CharField(max_length=20)),
                ("error_code", models.CharField(blank=True, max_length=24)),
                ("principal", models.CharField(blank=True, max_length=160)),
                ("calls", models.BigIntegerField(default=0)),
                ("timed", models.BigIntegerField(default=0)),
                ("sum_ms", models.BigIntegerField(default=0)),
                ("buckets", models.JSONField(default=list)),
            ],
        ),
        migrations.CreateModel(
            name="CallTotal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tool_ref", models.CharField(max_length=200)),
                ("status", models.CharField(max_length=20)),
                ("calls", models.BigIntegerField(default=0)),
                ("timed", models.BigIntegerField(default=0, help_text="Calls with a duration.")),
                ("sum_ms", models.BigIntegerField(default=0)),
                ("buckets", models.JSONField(default=list)),
            ],
        ),
        migrations.AddIndex(
            model_name="invocationrecord",
            index=models.Index(
                condition=models.Q(("ended_at__isnull", True)),
                fields=["started_at"],
                name="invocations_unfinished_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="runevent",
            index=models.Index(
                condition=models.Q(("type", "tool_call_result")),
                fields=["tenant", "run_id", "tool_call_id"],
                name="events_result_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="streamticket",
            index=models.Index(
                condition=models.Q(("session_key", ""), _negated=True),
                fields=["expires_at"],
                name="tickets_holding_session_idx",
            ),
        ),
        migrations.AddField(
            model_name="callend",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="tenants.tenant",
            ),
        ),
        migrations.AddField(
            model_name="callminute",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="tenants.tenant",
            ),
        ),
        migrations.AddField(
            model_name="calltotal",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="tenants.tenant",
            ),
        ),
        migrations.AddConstraint(
            model_name="callminute",
            constraint=models.UniqueConstraint(
                fields=("minute", "tenant", "tool_ref", "status", "error_code", "principal"),
                name="one_minute_per_key",
            ),
        ),
        migrations.AddConstraint(
            model_name="calltotal",
            constraint=models.UniqueConstraint(
                fields=("tenant", "tool_ref", "status"), name="one_total_per_key"
            ),
        ),
        migrations.RunSQL(RUNNING_ENTRIES, "DROP INDEX IF EXISTS invocations_running_tasks_idx"),
        migrations.RunPython(count_history, migrations.RunPython.noop),
        migrations.RunPython(add_triggers, drop_triggers),
    ]
