"""What a record's and an event's chain entry proves: the digest of its audited columns.

The digest is one SQL expression per database, computed by the triggers that journal a
row as it is written (migration 0001) and by `verify_audit` over the row as it is now, so
both hash the very same text: a JSON array of the audited columns (SQLite's json_array,
PostgreSQL's json_build_array; times as PostgreSQL epoch seconds, whatever the session's
time zone), SHA-256 in hex. On SQLite, SHA256() is the function Django registers on each
of its connections: a write through a connection without it (the sqlite3 shell) fails
instead of leaving no trace.

Version 2 (migration 0003) audits every column of a record but its `tool` and
`retry_of` (links set to NULL when the tool or the earlier attempt is deleted),
`args_shape` (derived from the args) and `cancel_requested` (a request, not an
outcome): the receipt and the trace context included. Version 1 (entries linked before
0003) left out the receipt, the trace context and the columns added after it.

Changing a column list or an expression changes every digest: old entries would no
longer match their rows. Do it only with a migration that re-creates the triggers and a
digest version the verifier understands (`AuditEntry.v`).
"""

from __future__ import annotations

RECORDS = "invocations_invocationrecord"
EVENTS = "invocations_runevent"
PENDING = "audit_auditpending"

RECORD_COLUMNS_V1 = (
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
RECORD_COLUMNS = (
    *RECORD_COLUMNS_V1,
    "traceparent",
    "receipt",
    "cache_hit",
    "hooks",
    "attempt",
    "retries",
)
RECORD_TIMES = ("created_at", "started_at", "ended_at")
# A change of an ended record that is not an edit: /mcp/ keeps the caller's trace context
# on the record once the call has returned (apps/mcp/server/tracing.py).
LATE = ("traceparent",)
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


def record_digest(vendor: str, row: str, v: int = 2) -> str:
    columns = RECORD_COLUMNS if v >= 2 else RECORD_COLUMNS_V1
    return digest_sql(vendor, row, columns, RECORD_TIMES)


def event_digest(vendor: str, row: str, v: int = 2) -> str:
    """The same columns in both versions."""
    return digest_sql(vendor, row, EVENT_COLUMNS, EVENT_TIMES)


def _changed_sqlite(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in columns)


def _changed_postgresql(columns: tuple[str, ...]) -> str:
    old = ", ".join(f"OLD.{c}" for c in columns)
    new = ", ".join(f"NEW.{c}" for c in columns)
    return f"({old}) IS DISTINCT FROM ({new})"


HEADS = "audit_audithead"
ENTRIES = "audit_auditentry"
GENESIS = "0" * 64
_ENTRY_COLUMNS = "tenant_id, n, v, kind, row_id, run_id, event_seq, op, digest, at, link"
_PENDING_COLUMNS = "tenant_id, kind, row_id, run_id, event_seq, op, digest, at, xid"


def _unchanged_but_late_sqlite() -> str:
    """An ended record whose only change is its trace context, set once."""
    others = [c for c in RECORD_COLUMNS if c not in LATE]
    same = " AND ".join(f"OLD.{c} IS NEW.{c}" for c in others)
    return f"(OLD.traceparent = '' AND NEW.traceparent <> '' AND {same})"


def _append_sqlite(kind: str, row_id: str, seq: str, op: str, digest: str) -> str:
    """The statements that append a write to its tenant's chain (SQLite serialises
    writers: no lock to take). The entry first, holding the previous link; then its link
    (over its own columns: the digest computed once); then the head."""
    now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    # Microseconds since the epoch of `at` (milliseconds here): julianday keeps whole
    # milliseconds, so the rounding is exact. (No '%s' format: Django's SQLite cursor
    # takes it for a parameter.)
    micros = "((CAST(ROUND(julianday(at) * 86400000) AS INTEGER) - 210866760000000) * 1000)"
    fields = " || '|' || ".join(("n", "kind", "row_id", "op", "digest", micros))
    text = f"link || '2|' || {fields}"
    return f"""
            INSERT OR IGNORE INTO {HEADS} (tenant_id, n, link, verified_n, broken)
            VALUES (NEW.tenant_id, 0, '{GENESIS}', 0, '');
            INSERT INTO {ENTRIES} ({_ENTRY_COLUMNS})
            SELECT NEW.tenant_id, h.n + 1, 2, '{kind}', {row_id}, NEW.run_id, {seq}, {op},
                   {digest}, {now}, h.link
            FROM {HEADS} h WHERE h.tenant_id = NEW.tenant_id;
            UPDATE {ENTRIES} SET link = SHA256({text})
            WHERE tenant_id = NEW.tenant_id
              AND n = (SELECT h.n + 1 FROM {HEADS} h WHERE h.tenant_id = NEW.tenant_id);
            UPDATE {HEADS} SET n = n + 1, link = (
                SELECT e.link FROM {ENTRIES} e
                WHERE e.tenant_id = NEW.tenant_id AND e.n = {HEADS}.n + 1
            ) WHERE tenant_id = NEW.tenant_id;"""  # noqa: S608 (names, not values)


def sqlite_triggers() -> list[str]:
    record = record_digest("sqlite", "NEW")
    event = event_digest("sqlite", "NEW")
    changed_op = (
        "CASE WHEN OLD.ended_at IS NULL OR "
        f"{_unchanged_but_late_sqlite()} THEN 'update' ELSE 'edit' END"
    )
    return [
        f"""CREATE TRIGGER audit_record_written AFTER INSERT ON {RECORDS}
        BEGIN{_append_sqlite("record", "NEW.id", "NULL", "'insert'", record)}
        END""",
        f"""CREATE TRIGGER audit_record_changed AFTER UPDATE ON {RECORDS}
        WHEN {_changed_sqlite(RECORD_COLUMNS)}
        BEGIN{_append_sqlite("record", "NEW.id", "NULL", changed_op, record)}
        END""",
        f"""CREATE TRIGGER audit_event_written AFTER INSERT ON {EVENTS}
        BEGIN{_append_sqlite("event", "NEW.id", "NEW.seq", "'insert'", event)}
        END""",
        f"""CREATE TRIGGER audit_event_changed AFTER UPDATE ON {EVENTS}
        WHEN {_changed_sqlite(EVENT_COLUMNS)}
        BEGIN{_append_sqlite("event", "NEW.id", "NEW.seq", "'edit'", event)}
        END""",
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
    others = [c for c in RECORD_COLUMNS if c not in LATE]
    late = (
        "OLD.traceparent = '' AND NEW.traceparent <> '' AND "
        f"({', '.join(f'OLD.{c}' for c in others)}) IS NOT DISTINCT FROM "
        f"({', '.join(f'NEW.{c}' for c in others)})"
    )
    return [
        # At commit (a deferred constraint trigger, once per pending row: the first does
        # the work), the transaction's pending writes are appended, tenant by tenant in
        # ascending id: every transaction takes heads in the same order, so a worker's
        # transaction that ends one tenant's call and starts another's cannot deadlock
        # with one doing the reverse; a head is held from there to the commit only.
        f"""CREATE FUNCTION audit_link_mine() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            me bigint := txid_current();
            t bigint;
            p record;
            h_n bigint;
            h_link text;
            at timestamptz;
        BEGIN
            -- Linked already by an earlier firing of this transaction: one lookup by key,
            -- so a transaction of N writes costs N lookups, not N scans of its journal.
            IF NOT EXISTS (SELECT 1 FROM {PENDING} WHERE id = NEW.id) THEN
                RETURN NULL;
            END IF;
            FOR t IN SELECT DISTINCT tenant_id FROM {PENDING} WHERE xid = me ORDER BY tenant_id
            LOOP
                -- The head locked once and written once per tenant, however many writes.
                SELECT n, link INTO h_n, h_link FROM {HEADS} WHERE tenant_id = t FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO {HEADS} (tenant_id, n, link, verified_n, broken)
                    VALUES (t, 0, '{GENESIS}', 0, '') ON CONFLICT DO NOTHING;
                    SELECT n, link INTO h_n, h_link FROM {HEADS} WHERE tenant_id = t FOR UPDATE;
                END IF;
                FOR p IN SELECT * FROM {PENDING} WHERE xid = me AND tenant_id = t ORDER BY id
                LOOP
                    at := clock_timestamp();
                    h_n := h_n + 1;
                    h_link := encode(sha256(convert_to(h_link || '2|' || h_n || '|' || p.kind
                        || '|' || p.row_id || '|' || p.op || '|' || p.digest || '|'
                        || (extract(epoch from at) * 1000000)::bigint, 'UTF8')), 'hex');
                    INSERT INTO {ENTRIES} ({_ENTRY_COLUMNS})
                    VALUES (t, h_n, 2, p.kind, p.row_id, p.run_id, p.event_seq, p.op, p.digest,
                            at, h_link);
                END LOOP;
                UPDATE {HEADS} SET n = h_n, link = h_link WHERE tenant_id = t;
                DELETE FROM {PENDING} WHERE xid = me AND tenant_id = t;
            END LOOP;
            RETURN NULL;
        END $$""",  # noqa: S608 (names, not values)
        f"""CREATE FUNCTION audit_journal_record() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'record', NEW.id::text, NEW.run_id, NULL,
                    CASE WHEN TG_OP = 'INSERT' THEN 'insert'
                         WHEN OLD.ended_at IS NULL OR ({late}) THEN 'update' ELSE 'edit' END,
                    {record}, clock_timestamp(), txid_current());
            RETURN NULL;
        END $$""",  # noqa: S608
        f"""CREATE FUNCTION audit_journal_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {PENDING} ({_PENDING_COLUMNS})
            VALUES (NEW.tenant_id, 'event', NEW.id::text, NEW.run_id, NEW.seq,
                    CASE WHEN TG_OP = 'INSERT' THEN 'insert' ELSE 'edit' END,
                    {event}, clock_timestamp(), txid_current());
            RETURN NULL;
        END $$""",  # noqa: S608
        f"""CREATE CONSTRAINT TRIGGER audit_link_at_commit AFTER INSERT ON {PENDING}
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_link_mine()""",
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
    f"DROP TRIGGER IF EXISTS audit_link_at_commit ON {PENDING}",
    "DROP FUNCTION IF EXISTS audit_link_mine()",
    f"DROP TRIGGER IF EXISTS audit_record_written ON {RECORDS}",
    f"DROP TRIGGER IF EXISTS audit_record_changed ON {RECORDS}",
    f"DROP TRIGGER IF EXISTS audit_event_written ON {EVENTS}",
    f"DROP TRIGGER IF EXISTS audit_event_changed ON {EVENTS}",
    "DROP FUNCTION IF EXISTS audit_journal_record()",
    "DROP FUNCTION IF EXISTS audit_journal_event()",
]
