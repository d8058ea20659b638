"""A queued call's start, and a call's own writes, as one statement on PostgreSQL (issue 13).

A worker starting an approved call writes, in one transaction: the ends of the calls it
ran before (their records' closing UPDATEs, runner.Closing), the claim (approved ->
executing, only if still approved), the record's start, one number per event from the
runs' counters, and the events (the ends' tool_call_result, the start's
tool_call_start). Sent one by one that was BEGIN, five statements and COMMIT: seven
round trips, each a pass through the ORM, psycopg and PostgreSQL's parser.

`write()` sends the same writes as one statement of data-modifying CTEs, which
PostgreSQL runs as one transaction (in autocommit; inside a caller's transaction, as part
of it):

- the claim is a CTE; the start's UPDATE and the start's event apply only if it returned
  a row, so a lost claim (a cancel first, another worker first) writes the ends alone;
- the claim also requires the authorization epoch to be the one the call's checks were
  answered at. A worker checks a call at the epoch its previous statement answered
  (no read of its own), so an edit committed since makes the claim miss, and the
  runner checks the call again at the new epoch (an edit holds on the next call);
- the runs' counters are raised by an upsert of the wanted events' count per run, in a
  fixed order (no deadlock between workers), and each event's number is its run's new
  last number minus the wanted events after it, written into its stored message too.

A batch's last ends (runner.Closing.flush) are the same statement without a claim: an
empty `claimed`, the ends' UPDATEs, the counters and their events.

`write_many()` takes several claims, each with the updates and events written only if it
applies: the calls of tools that never wait, started together (runner.resume_together).
Each claim is a CTE of its own (`claim0`, `claim1`, ...) answering its position, and
`claimed` is their union; the answer lists the positions that applied.

`record()` sends a call's own writes the same way, without a claim: its record inserted
with its events (a call recorded before it runs: the record and tool_call_start; a quick
call written at its end: the record and both events), or its end (the record's closing
columns and tool_call_result). Sent one by one that was BEGIN, three statements and
COMMIT, twice for a call recorded before it runs (runner._written_together).

What each row ends up holding is what the statements one by one write, for the same
values; `tests/approvals/test_combined_start.py` and
`tests/invocations/test_one_statement.py` compare them. Other databases (SQLite)
keep the statements one by one: `available()`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.db import connections
from django.utils import timezone

from apps.invocations import events, leases, statements
from apps.invocations.events import Event, EventMessage
from apps.invocations.models import Run, RunEvent, Status
from apps.tenants import epoch
from apps.tenants.models import Tenant
from toolhub.db.postgresql import statement_cursor

# The event columns a start's statement writes from VALUES, in this order (seq is numbered
# in the statement).
_EVENT_COLUMNS = ("tenant", "run_id", "type", "tool_call_id", "tool_id", "message", "at")


@dataclass
class Pending:
    """One event to write: `needs_claim` ones only if their claim (the `claim`-th of the
    statement's) applies."""

    tenant: Tenant
    run_id: str
    event: Event
    needs_claim: bool
    claim: int = 0
    end: Any = None  # the record whose end this event reports: written only with it


@dataclass
class Claim:
    """A claim (approved -> executing) and the updates written only if it applies."""

    guarded: statements.Guarded
    updates: list[tuple[Any, tuple[str, ...]]]


def available(using: str = "default") -> bool:
    return connections[using].vendor == "postgresql"


@dataclass
class Started:
    claimed: bool  # the (first) claim applied: the start and its event were written
    epoch: int | None  # the authorization epoch the statement saw (apps.tenants.epoch)
    applied: list[bool]  # per claim (write_many), in order


def write(
    updates: list[tuple[Any, tuple[str, ...]]],
    claim: statements.Guarded | None,
    claimed_updates: list[tuple[Any, tuple[str, ...]]],
    pending: list[Pending],
    at_epoch: int | None,
) -> Started | None:
    """Send `updates`, the claim, `claimed_updates` (only if it applied) and the events of
    `pending` as one statement. The claim also requires the authorization epoch to still
    be `at_epoch`, the one the call's checks were answered at: after an edit it does not
    apply, and the answer's epoch differs (check again). Without a claim (a batch's last
    ends, Closing.flush) `updates` and the events that do not need one are written. None,
    with nothing sent, when a row has a field only Django's own update can write: use the
    statements one by one."""
    assert claim is not None or not claimed_updates
    claims = [Claim(claim, claimed_updates)] if claim is not None else []
    first = claim.row if claim is not None else updates[0][0]
    return write_many(first._state.db or "default", updates, claims, pending, at_epoch)


def record(
    using: str,
    inserts: list[Any],
    updates: list[tuple[Any, tuple[str, ...]]],
    pending: list[Pending],
) -> bool:
    """A call's own writes as one statement, without a claim: its record inserted (a start,
    or a quick call written once at its end) or its end updated, and its events. False,
    with nothing sent, when a row needs Django's own statements."""
    return write_many(using, updates, [], pending, None, inserts, together=True) is not None


def write_many(
    using: str,
    updates: list[tuple[Any, tuple[str, ...]]],
    claims: list[Claim],
    pending: list[Pending],
    at_epoch: int | None,
    inserts: list[Any] | None = None,
    *,
    together: bool = False,
) -> Started | None:
    """`write` with any number of claims, each with the updates written only if it
    applies (several calls of tools that never wait, started together: runner.
    resume_together). Every claim requires the epoch to be `at_epoch`; the answer says
    which applied. `inserts` are unsaved rows written whatever the claims do (a call's
    record: `record()`); a key one of them repeats fails the whole statement. `together`:
    a run's events are pushed in one message, as events.emit_many() pushes a batch."""
    connection = connections[using]
    parts: list[str] = []
    params: list[Any] = []
    current = epoch.value_sql(using)
    applied: list[statements.Guarded] = []
    for index, row in enumerate(inserts or ()):
        built = statements.insert_sql([row], using)
        if built is None:
            return None
        parts.append(f"i{index} AS ({built[0]} RETURNING 1)")
        params += built[1]

    def undo() -> None:
        for guarded in applied:
            guarded.undo()

    if not claims:
        parts.append("claimed AS (SELECT 0 AS k WHERE false)")
    names = ["claimed"] if len(claims) == 1 else [f"claim{n}" for n in range(len(claims))]
    for order, (name, claim) in enumerate(zip(names, claims, strict=True)):
        guarded = claim.guarded
        guarded.apply()
        applied.append(guarded)
        built = statements.update_sql(guarded.row, guarded.fields, only_if=guarded.only_if)
        if built is None:
            undo()
            return None
        parts.append(f"{name} AS ({built[0]} AND {current} = %s RETURNING {order} AS k)")
        params += [*built[1], at_epoch]
    if len(claims) > 1:
        union = " UNION ALL ".join(f"SELECT k FROM {name}" for name in names)  # noqa: S608
        parts.append(f"claimed AS ({union})")
    guarded_updates: list[tuple[Any, tuple[str, ...], int | None]] = [
        (row, fields, None) for row, fields in updates
    ]
    guarded_updates += [
        (row, fields, n) for n, claim in enumerate(claims) for row, fields in claim.updates
    ]
    # A leased call's end applies only while its record is still running (leases.guard):
    # its CTE answers a negative number in `ends`, and its events need that number.
    ends: dict[int, tuple[int, Any]] = {}
    for index, (row, fields, needs) in enumerate(guarded_updates):
        late = needs is None and leases.guarded(row)
        only_if = {"status": Status.RUNNING} if late else None
        built = statements.update_sql(row, fields, only_if=only_if)
        if built is None:
            undo()
            return None
        guard = (
            "" if needs is None else f" AND EXISTS (SELECT 1 FROM claimed WHERE k = {needs})"  # noqa: S608
        )
        if late:
            ends[id(row)] = (-1 - index, row)
        answer = f"{-1 - index} AS k" if late else "1"
        parts.append(f"u{index} AS ({built[0]}{guard} RETURNING {answer})")
        params += built[1]
    ended = " UNION ALL ".join(f"SELECT k FROM u{-1 - k}" for k, _ in ends.values())  # noqa: S608
    parts.append(f"ends AS ({ended or 'SELECT 0 AS k WHERE false'})")
    pending = [
        replace(item, needs_claim=True, claim=ends[id(item.end)][0])
        if item.end is not None and id(item.end) in ends
        else item
        for item in pending
    ]
    streamed = [events.streamed(item.run_id, item.event, 0) for item in pending]
    if pending:
        sql, event_params = _events_sql(connection, pending, streamed)
        parts.append(sql)
        params += event_params
    numbered = "numbered" if pending else "(SELECT NULL::bigint, NULL::text, NULL::bigint)"
    parts_sql = ", ".join(parts)
    answer_sql = (
        "SELECT ARRAY(SELECT k FROM claimed UNION ALL SELECT k FROM ends), "  # noqa: S608
        f"{current}, n.tenant_id, n.run_id, "
        f"n.last_seq FROM (SELECT 1) AS one LEFT JOIN {numbered} AS n(tenant_id, run_id, "
        "last_seq) ON true"
    )
    try:
        # Prepared once per connection and shape (toolhub/db/postgresql/base.py): parsing
        # and planning this statement was most of PostgreSQL's work per queued call.
        with statement_cursor(connection) as cursor:
            cursor.execute(_kept_text(f"WITH {parts_sql} {answer_sql}"), params)
            answer = cursor.fetchall()
    except BaseException:  # nothing was written: the rows as they were
        undo()
        raise
    statements.inserted(list(inserts or ()), using)
    took, seen = set(answer[0][0]), answer[0][1]
    for order, claim in enumerate(claims):
        if order not in took:
            claim.guarded.undo()
    for k, row in ends.values():
        if k not in took:  # settled meanwhile: its end and its event were not written
            leases.late_end(row)
    last = {(int(t), str(r)): int(s) for _, _, t, r, s in answer if t is not None}
    written = [
        item
        for item in zip(pending, streamed, strict=True)
        if not item[0].needs_claim or item[0].claim in took
    ]
    _number([((item.tenant.pk, item.run_id), message) for item, (message, _) in written], last)
    # One push per event, as events.gathered(); a call's own events (`record()`) in one,
    # as events.emit_many().
    batches: list[tuple[Tenant, str, list[Event]]] = []
    messages: list[list[EventMessage]] = []
    for item, (message, _) in written:
        if together and batches and batches[-1][:2] == (item.tenant, item.run_id):
            batches[-1][2].append(item.event)
            messages[-1].append(message)
            continue
        batches.append((item.tenant, item.run_id, [item.event]))
        messages.append([message])
    events.push_after_commit(batches, messages)
    flags = [order in took for order in range(len(claims))]
    return Started(bool(flags) and flags[0], None if seen is None else int(seen), flags)


_texts: dict[str, str] = {}
# A statement's shapes: its number of earlier ends, its number of claims, which events
# need which claim (a worker's batch is at most CLAIM_BATCH calls).
_TEXTS_KEPT = 1024


def _kept_text(sql: str) -> str:
    """The same str object for the same text: psycopg keeps a cursor's adaptation state
    while it is sent the very object it was sent last (toolhub/db/postgresql/base.py)."""
    kept = _texts.get(sql)
    if kept is None:
        if len(_texts) >= _TEXTS_KEPT:
            return sql
        kept = _texts[sql] = sql
    return kept


@dataclass(frozen=True)
class _EventColumns:
    """What the events' part of the statement needs of RunEvent, per database."""

    fields: list[Any]  # RunEvent's fields, in _EVENT_COLUMNS' order
    casts: list[str]  # each one's type for a VALUES cast
    names: str  # their quoted columns
    message_select: str  # the written columns, the message renumbered
    run_table: str
    event_table: str


_columns: dict[str, _EventColumns] = {}
_event_statements: dict[tuple[str, tuple[tuple[bool, int], ...]], str] = {}


def _event_columns(connection: Any) -> _EventColumns:
    found = _columns.get(connection.alias)
    if found is None:
        quote = connection.ops.quote_name
        fields = [RunEvent._meta.get_field(name) for name in _EVENT_COLUMNS]
        columns = [str(field.column) for field in fields]  # type: ignore[union-attr]
        found = _columns[connection.alias] = _EventColumns(
            fields=fields,
            casts=[str(field.cast_db_type(connection)) for field in fields],  # type: ignore[union-attr]
            names=", ".join(quote(column) for column in columns),
            message_select=", ".join(
                "jsonb_set(w.message, '{seq}', to_jsonb(n.last_seq - w.later))"
                if column == "message"
                else f"w.{quote(column)}"
                for column in columns
            ),
            run_table=quote(Run._meta.db_table),
            event_table=quote(RunEvent._meta.db_table),
        )
    return found


def _events_sql(
    connection: Any, pending: list[Pending], streamed: list[tuple[EventMessage, Any]]
) -> tuple[str, list[Any]]:
    """The events' CTEs (wanted, numbered, written) and their parameters. The text depends
    only on the database and on which events need the claim: built once per shape."""
    table = _event_columns(connection)
    gated = tuple((item.needs_claim, item.claim) for item in pending)
    params: list[Any] = []
    for item, (message, at) in zip(pending, streamed, strict=True):
        # What Django writes for each column (get_db_prep_save), as statements.insert.
        event = item.event
        values = {
            "tenant": item.tenant.pk,
            "run_id": item.run_id,
            "type": event.type,
            "tool_call_id": event.tool_call_id,
            "tool_id": event.tool_id,
            "message": message,
            "at": at,
        }
        for name, field in zip(_EVENT_COLUMNS, table.fields, strict=True):
            params.append(field.get_db_prep_save(values[name], connection=connection))
    params.append(connection.ops.adapt_datetimefield_value(timezone.now()))
    key = (connection.alias, gated)
    sql = _event_statements.get(key)
    if sql is None:
        rows = [
            "("
            + ", ".join(
                [f"{order}", *(f"%s::{cast}" for cast in table.casts), str(needs).upper(), f"{k}"]
            )
            + ")"
            for order, (needs, k) in enumerate(gated)
        ]
        sql = _event_statements[key] = (
            f"wanted AS (SELECT * FROM (VALUES {', '.join(rows)}) "  # noqa: S608 (names only)
            f"AS e(ord, {table.names}, needs_claim, claim) "
            "WHERE NOT e.needs_claim OR e.claim IN (SELECT k FROM claimed) "
            "OR e.claim IN (SELECT k FROM ends)), "
            f"numbered AS (INSERT INTO {table.run_table} (tenant_id, run_id, last_seq, "
            "created_at) SELECT tenant_id, run_id, count(*), %s::timestamptz FROM wanted "
            "GROUP BY tenant_id, run_id ORDER BY tenant_id, run_id "
            f"ON CONFLICT (tenant_id, run_id) DO UPDATE SET last_seq = {table.run_table}"
            ".last_seq + excluded.last_seq RETURNING tenant_id, run_id, last_seq), "
            f"written AS (INSERT INTO {table.event_table} ({table.names}, seq) SELECT "
            f"{table.message_select}, n.last_seq - w.later FROM (SELECT *, count(*) OVER "
            "(PARTITION BY tenant_id, run_id ORDER BY ord DESC) - 1 AS later FROM wanted) "
            "AS w JOIN numbered AS n ON n.tenant_id = w.tenant_id AND n.run_id = w.run_id "
            "RETURNING 1)"
        )
    return sql, params


def _number(
    written: list[tuple[tuple[int, str], EventMessage]], last: dict[tuple[int, str], int]
) -> None:
    """Give the written events' messages the numbers the statement gave them: a run's
    last one its new last number, each earlier one one less."""
    after: dict[tuple[int, str], int] = {}
    for key, message in reversed(written):
        message["seq"] = last[key] - after.get(key, 0)
        after[key] = after.get(key, 0) + 1
