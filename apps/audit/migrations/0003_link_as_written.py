"""Link each write as it is written (version 2): the triggers append to the tenant's
chain under its head row (SQLite: in the writing statement; PostgreSQL: when the writing
transaction commits) instead of journaling a pending entry for the sweeper; the record's
digest covers its receipt, trace context and later columns. The pending
entries left by the version 1 triggers are linked here first, as version 1."""

from typing import Any

from django.db import migrations, models

from apps.audit import digests, legacy
from apps.audit.models import canonical, chain_link


def link_as_written(apps: Any, schema_editor: Any) -> None:
    postgresql = schema_editor.connection.vendor == "postgresql"
    for statement in digests.POSTGRESQL_DROP if postgresql else digests.SQLITE_DROP:
        schema_editor.execute(statement)
    link_left_pending(apps)
    for statement in digests.postgresql_triggers() if postgresql else digests.sqlite_triggers():
        schema_editor.execute(statement)


def link_left_pending(apps: Any) -> None:
    pending_model = apps.get_model("audit", "AuditPending")  # all version 1 here
    entry_model = apps.get_model("audit", "AuditEntry")
    head_model = apps.get_model("audit", "AuditHead")
    tenants = pending_model.objects.values_list("tenant_id", flat=True).distinct()
    for tenant_id in list(tenants):
        head, _ = head_model.objects.get_or_create(tenant_id=tenant_id)
        n, link = head.n, head.link
        while page := list(pending_model.objects.filter(tenant_id=tenant_id).order_by("id")[:2000]):
            entries = []
            for item in page:
                n += 1
                link = chain_link(
                    link, canonical(n, item.kind, item.row_id, item.op, item.digest, item.at)
                )
                entries.append(
                    entry_model(
                        tenant_id=tenant_id, n=n, v=1, kind=item.kind, row_id=item.row_id,
                        run_id=item.run_id, event_seq=item.event_seq, op=item.op,
                        digest=item.digest, at=item.at, link=link,
                    )
                )
            entry_model.objects.bulk_create(entries, batch_size=500)
            pending_model.objects.filter(pk__in=[p.pk for p in page]).delete()
        head_model.objects.filter(pk=tenant_id).update(n=n, link=link)


def journal_again(apps: Any, schema_editor: Any) -> None:
    postgresql = schema_editor.connection.vendor == "postgresql"
    for statement in digests.POSTGRESQL_DROP if postgresql else digests.SQLITE_DROP:
        schema_editor.execute(statement)
    for statement in legacy.postgresql_triggers() if postgresql else legacy.sqlite_triggers():
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0002_checkpoint_signature"),
        ("invocations", "0012_idempotency_ledger"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditentry",
            name="v",
            field=models.PositiveSmallIntegerField(default=1, help_text="Digest and link version."),
        ),
        migrations.AddField(
            model_name="auditpending",
            name="xid",
            field=models.BigIntegerField(
                blank=True, help_text="The writing transaction.", null=True
            ),
        ),
        migrations.AddIndex(
            model_name="auditpending",
            index=models.Index(fields=["xid"], name="audit_audit_xid_43ddca_idx"),
        ),
        migrations.RunPython(link_as_written, journal_again),
    ]
