"""What a record's and an event's chain entry proves: the digest of its audited columns.

The digest is one SQL expression per database, computed by the triggers that journal a
row as it is written (migration 0001) and by `verify_audit` over the row as it is now, so
both hash the very same text: a JSON array of the audited columns (SQLite's json_array,
PostgreSQL's json_build_array; times as PostgreSQL epoch seconds, whatever the session's
time zone), SHA-256 in hex. On SQLite, SHA256() is the function Django registers on each
of its connections: a write through a connection without it (the sqlite3 shell) fails
instead of leaving no trace.

Not audited: a record's `tool` (set to NULL when the tool is deleted), `args_shape`
(derived from the args), `cancel_requested` (a request, not an outcome) and
`traceparent` (the caller's trace context, kept by /mcp/ after the call has ended).

Changing a column list or an expression changes every digest: old entries would no
longer match their rows. Do it only with a migration that re-creates the triggers and a
digest version the verifier understands.
"""

from __future__ import annotations

RECORDS = "invocations_invocationrecord"
EVENTS = "invocations_runevent"
PENDING = "audit_auditpending"

RECORD_COLUMNS = (
    "id",
    "tenant_id",
    "tool_ref",
    "tool_call_id",
    "run_id",
    "principal",
    "connection_id",
    "idempotency_key",
    "request_hash",
    "status",
    "ok",
    "args",
    "result",
    "error_code",
    "safe_message",
    "policy_rule",
    "created_at",
    "started_at",
    "ended_at",
    "duration_ms",
    "retry_after_ms",
)
RECORD_TIMES = ("created_at", "started_at", "ended_at")
EVENT_COLUMNS = (
    "id",
    "tenant_id",
    "run_id",
    "seq",
    "type",
    "tool_call_id",
    "tool_id",
    "message",
    "at",
)
EVENT_TIMES = ("at",)


def digest_sql(vendor: str, row: str, columns: tuple[str, ...], times: tuple[str, ...]) -> str:
    """The digest of `row`'s audited columns (`row`: NEW in a trigger, a table name in a
    query)."""
    if vendor == "postgresql":
        values = ", ".join(
            f"extract(epoch from {row}.{c})" if c in times else f"{row}.{c}" for c in columns
        )
        return f"encode(sha256(convert_to(json_build_array({values})::text, 'UTF8')), 'hex')"
    values = ", ".join(f"{row}.{c}" for c in columns)
    return f"SHA256(json_array({values}))"


def record_digest(vendor: str, row: str) -> str:
    return digest_sql(vendor, row, RECORD_COLUMNS, RECORD_TIMES)


def event_digest(vendor: str, row: str) -> str:
    return digest_sql(vendor, row, EVENT_COLUMNS, EVENT_TIMES)


def _changed_sqlite(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in columns)


def _changed_postgresql(columns: tuple[str, ...]) -> str:
    old = ", ".join(f"OLD.{c}" for c in columns)
    new = ", ".join(f"NEW.{c}" for c in columns)
    return f"({old}) IS DISTINCT FROM ({new})"


_PENDING_COLUMNS = "tenant_id, kind, row_id, run_id, event_seq, op, digest, at"


def sqlite_triggers() -> list[str]:
    now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    record = record_digest("sqlite", "NEW")
    event = event_digest("sqlite", "NEW")
    return [
        f"""CREATE TRIGGER audit_record_written AFTER INSERT ON {RECORDS}
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'record', NEW.id, NEW.run_id, NULL, 'insert', {record}, {now});
        END""",  # noqa: S608 (names, not values)
        f"""CREATE TRIGGER audit_record_changed AFTER UPDATE ON {RECORDS}
        WHEN {_changed_sqlite(RECORD_COLUMNS)}
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


SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS audit_record_written",
    "DROP TRIGGER IF EXISTS audit_record_changed",
    "DROP TRIGGER IF EXISTS audit_event_written",
    "DROP TRIGGER IF EXISTS audit_event_changed",
]


def postgresql_triggers() -> list[str]:
    record = record_digest("postgresql", "NEW")
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
        FOR EACH ROW WHEN ({_changed_postgresql(RECORD_COLUMNS)})
        EXECUTE FUNCTION audit_journal_record()""",
        f"""CREATE TRIGGER audit_event_written AFTER INSERT ON {EVENTS}
        FOR EACH ROW EXECUTE FUNCTION audit_journal_event()""",
        f"""CREATE TRIGGER audit_event_changed AFTER UPDATE ON {EVENTS}
        FOR EACH ROW WHEN ({_changed_postgresql(EVENT_COLUMNS)})
        EXECUTE FUNCTION audit_journal_event()""",
    ]


POSTGRESQL_DROP = [
    f"DROP TRIGGER IF EXISTS audit_record_written ON {RECORDS}",
    f"DROP TRIGGER IF EXISTS audit_record_changed ON {RECORDS}",
    f"DROP TRIGGER IF EXISTS audit_event_written ON {EVENTS}",
    f"DROP TRIGGER IF EXISTS audit_event_changed ON {EVENTS}",
    "DROP FUNCTION IF EXISTS audit_journal_record()",
    "DROP FUNCTION IF EXISTS audit_journal_event()",
]
