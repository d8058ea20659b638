"""The version 1 triggers (migration 0001): each write journaled as a pending entry, for
the sweeper to link. Frozen here for that migration and for 0003's reverse."""

from __future__ import annotations

from apps.audit.digests import (
    EVENT_COLUMNS,
    EVENTS,
    PENDING,
    RECORD_COLUMNS_V1,
    RECORDS,
    _changed_postgresql,
    _changed_sqlite,
    event_digest,
    record_digest,
)

_PENDING_COLUMNS = "tenant_id, kind, row_id, run_id, event_seq, op, digest, at"


def sqlite_triggers() -> list[str]:
    now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    record = record_digest("sqlite", "NEW", v=1)
    event = event_digest("sqlite", "NEW")
    return [
        f"""CREATE TRIGGER audit_record_written AFTER INSERT ON {RECORDS}
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'record', NEW.id, NEW.run_id, NULL, 'insert', {record}, {now});
        END""",  # noqa: S608 (names, not values)
        f"""CREATE TRIGGER audit_record_changed AFTER UPDATE ON {RECORDS}
        WHEN {_changed_sqlite(RECORD_COLUMNS_V1)}
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'record', NEW.id, NEW.run_id, NULL,
                    CASE WHEN OLD.ended_at IS NULL THEN 'update' ELSE 'edit' END,
                    {record}, {now});
        END""",  # noqa: S608
        f"""CREATE TRIGGER audit_event_written AFTER INSERT ON {EVENTS}
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'event', NEW.id, NEW.run_id, NEW.seq, 'insert', {event}, {now});
        END""",  # noqa: S608
        f"""CREATE TRIGGER audit_event_changed AFTER UPDATE ON {EVENTS}
        WHEN {_changed_sqlite(EVENT_COLUMNS)}
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'event', NEW.id, NEW.run_id, NEW.seq, 'edit', {event}, {now});
        END""",  # noqa: S608
    ]


def postgresql_triggers() -> list[str]:
    record = record_digest("postgresql", "NEW", v=1)
    event = event_digest("postgresql", "NEW")
    return [
        f"""CREATE FUNCTION audit_journal_record() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'record', NEW.id::text, NEW.run_id, NULL,
                    CASE WHEN TG_OP = 'INSERT' THEN 'insert'
                         WHEN OLD.ended_at IS NULL THEN 'update' ELSE 'edit' END,
                    {record}, clock_timestamp());
            RETURN NULL;
        END $$""",  # noqa: S608
        f"""CREATE FUNCTION audit_journal_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'event', NEW.id::text, NEW.run_id, NEW.seq,
                    CASE WHEN TG_OP = 'INSERT' THEN 'insert' ELSE 'edit' END,
                    {event}, clock_timestamp());
            RETURN NULL;
        END $$""",  # noqa: S608
        f"""CREATE TRIGGER audit_record_written AFTER INSERT ON {RECORDS}
        FOR EACH ROW EXECUTE FUNCTION audit_journal_record()""",
        f"""CREATE TRIGGER audit_record_changed AFTER UPDATE ON {RECORDS}
        FOR EACH ROW WHEN ({_changed_postgresql(RECORD_COLUMNS_V1)})
        EXECUTE FUNCTION audit_journal_record()""",
        f"""CREATE TRIGGER audit_event_written AFTER INSERT ON {EVENTS}
        FOR EACH ROW EXECUTE FUNCTION audit_journal_event()""",
        f"""CREATE TRIGGER audit_event_changed AFTER UPDATE ON {EVENTS}
        FOR EACH ROW WHEN ({_changed_postgresql(EVENT_COLUMNS)})
        EXECUTE FUNCTION audit_journal_event()""",
    ]
