"""A year of traffic (issue 45): what lists, pages and calls cost as history grows.

Builds synthetic history by direct inserts (never the API) in a throwaway database,
growing it level by level (`--records 0,100000,1000000,10000000`): rows the database
makes itself (INSERT .. SELECT over a series, about a million records a few minutes;
`--builder orm` for bulk_create in Python, an hour a million). At each level it
measures, in this process through Django's own handlers:

- a no-op call (`POST /api/v1/invocations/`, p50/p99), a dry-run decision, and an
  operator's decision request on a held call;
- each API list endpoint's first page and a deep one (cursor after ~`--deep` rows);
- each admin changelist (first page, a deep page, an exact-id search, a text search);
- the console's history (first page and after `--deep` rows by its keyset);
- a run replay from `after=0` over the run of `--run-calls` calls (WebSocket, in process);
- the tool catalog and MCP `tools/list` with `--tools` tools and `--rules` policies;
- the sweeper's pass, a `/metrics` scrape and the overview's data;
- an idle embedded Daphne's CPU on that database (`--idle` seconds, bench/history.py's).

It prints one table per level with each figure beside its goal (MET / NOT MET) and writes
`bench/results/scale-<date>-<database>.json`. PostgreSQL is a throwaway server of its own
(tests/support/postgres.py), with the EXPLAIN of the deep pages in the JSON.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS_DIR = ROOT / "bench" / "results"
TENANTS = 100
CALL_SAMPLES = 300  # at least, for the call's p50/p99
CALL_BLOCKS = 3  # taken at the start, in the middle and at the end of a level's figures
EVENTS_PER_RECORD = 3
RUN_LENGTH = 20  # calls per ordinary run
APPROVAL_EVERY = 100  # one record in a hundred was held for approval
BATCH = 20_000
SQL_BATCH = 200_000
YEAR = timedelta(days=365)
LONG_RUN = "run-long"


def say(text: str = "", flush: bool = True) -> None:
    sys.stdout.write(text + "\n")
    if flush:
        sys.stdout.flush()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def timed(
    fn: Callable[[], Any], samples: int, before: Callable[[], Any] | None = None
) -> dict[str, float]:
    """`fn`'s times; `before`, if given, runs before each call, off the clock."""
    fn()  # warm: caches, plans
    return summary(times_of(fn, samples, before))


def times_of(
    fn: Callable[[], Any], samples: int, before: Callable[[], Any] | None = None
) -> list[float]:
    times = []
    for _ in range(samples):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    samples = len(times)
    return {
        "p50": round(statistics.median(times), 2),
        "p95": round(percentile(times, 95), 2),
        "p99": round(percentile(times, 99), 2),
        "n": samples,
    }


# ------------------------------------------------------------------ the state


def setup_django(database: str, stack: ExitStack, work: Path) -> str:
    os.environ["DJANGO_SETTINGS_MODULE"] = "toolhub.settings"
    os.environ["TOOLHUB_VAR_DIR"] = str(work)
    os.environ["TOOLHUB_SECRET_KEY"] = os.urandom(32).hex()
    os.environ["TOOLHUB_ENCRYPTION_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
    # Replay is measured for the database's part: the stream's byte budget (256 KB/s by
    # default) would otherwise set the pace of a 300,000-event replay by itself.
    os.environ["TOOLHUB_WS_SEND_RATE"] = str(1 << 30)
    os.environ["TOOLHUB_WS_SEND_BURST"] = str(1 << 30)
    os.environ.pop("REDIS_URL", None)
    os.environ["TOOLHUB_LOG_LEVEL"] = "WARNING"
    os.environ["TOOLHUB_ALLOWED_HOSTS"] = "localhost"
    if database == "postgresql":
        from tests.support.postgres import postgres_server

        os.environ["DATABASE_URL"] = stack.enter_context(postgres_server()).url
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    return os.environ["DATABASE_URL"]


class World:
    """The tenants, the bench tenant's agent, a superuser, and how far history has grown."""

    def __init__(self) -> None:
        from django.contrib.auth.models import User

        from apps.tenants.models import Tenant
        from apps.tools.models import Tool
        from apps.tools.registry import registry
        from tests.conftest import allow, make_agent

        Tool.objects.sync_registry(registry)
        self.agent = make_agent("bench", "agent:bench")
        allow(self.agent.tenant, "core__get_current_time")
        Tenant.objects.bulk_create(
            [Tenant(slug=f"t{i:03}", name=f"Tenant {i}") for i in range(TENANTS - 1)]
        )
        self.tenant_ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
        self.admin = User.objects.create_superuser("bench-admin", "a@example.com", "pw-bench-1")
        # An agent of the bench tenant whose every call waits for an operator: the decision
        # request is measured on its calls.
        self.held = make_agent("bench", "agent:held")
        held = allow(self.agent.tenant, "core__get_current_time", name="held")
        held.principal, held.approval_effects = "agent:held", ["read_only"]
        held.save()
        self.records = 0
        self.approvals = 0
        self.long_run_calls = 0


def grow(world: World, target: int, run_calls: int, builder: str = "sql") -> dict[str, Any]:
    """Insert records (EVENTS_PER_RECORD events each, one approval per APPROVAL_EVERY)
    until `target`, oldest first over the past year; the bench tenant's first
    `run_calls` records form one long run."""
    from django.db import transaction

    from apps.approvals.models import ApprovalRequest, ApprovalStatus
    from apps.invocations.models import InvocationRecord, RunEvent
    from tests.support.times import own_times

    if builder == "sql":
        return grow_in_sql(world, target, run_calls)
    start = time.perf_counter()
    now = datetime.now(UTC)
    first = world.records
    bench_tenant = world.agent.tenant.pk
    counts = {"records": 0, "events": 0, "approvals": 0}
    with own_times(InvocationRecord, ApprovalRequest):
        for lo in range(first, target, BATCH):
            hi = min(target, lo + BATCH)
            records, events, approvals = [], [], []
            for i in range(lo, hi):
                # i counts from the oldest; spread over the year, 0 long ago, target ~now.
                at = now - YEAR + YEAR * (i / max(target, 1)) - timedelta(minutes=5)
                if world.long_run_calls < run_calls:
                    tenant, run, seq0 = bench_tenant, LONG_RUN, world.long_run_calls * 3
                    world.long_run_calls += 1
                else:
                    tenant = world.tenant_ids[i % TENANTS]
                    run, seq0 = f"run-{i // (RUN_LENGTH * TENANTS)}-{i % TENANTS}", 0
                    seq0 = ((i // TENANTS) % RUN_LENGTH) * EVENTS_PER_RECORD
                rid = uuid.uuid4()
                call = f"call-{i}"
                records.append(
                    InvocationRecord(
                        id=rid,
                        tenant_id=tenant,
                        tool_id="core__get_current_time",
                        tool_ref="core__get_current_time",
                        tool_call_id=call,
                        run_id=run,
                        principal=f"agent:a{i % 7}",
                        status="succeeded",
                        ok=True,
                        args={},
                        result={"iso": at.isoformat()},
                        policy_rule="allow",
                        created_at=at,
                        started_at=at,
                        ended_at=at + timedelta(milliseconds=3),
                        duration_ms=3,
                    )
                )
                for k, kind in enumerate(
                    ("tool_call_start", "tool_call_progress", "tool_call_result")
                ):
                    seq = seq0 + k + 1
                    events.append(
                        RunEvent(
                            tenant_id=tenant,
                            run_id=run,
                            seq=seq,
                            type=kind,
                            tool_call_id=call,
                            tool_id="core__get_current_time",
                            message={
                                "type": kind,
                                "seq": seq,
                                "runId": run,
                                "toolCallId": call,
                                "toolId": "core__get_current_time",
                                "at": at.isoformat(),
                            },
                            at=at,
                        )
                    )
                if i % APPROVAL_EVERY == 0:
                    approvals.append(
                        ApprovalRequest(
                            tenant_id=tenant,
                            invocation_id=rid,
                            tool_id="core__get_current_time",
                            status=ApprovalStatus.SUCCEEDED,
                            principal=f"agent:a{i % 7}",
                            requested_by_id=world.admin.pk,
                            run_id=run,
                            tool_call_id=call,
                            args={},
                            original_args={},
                            bound_hash="0" * 64,
                            hold_reason="bench",
                            expires_at=at + timedelta(minutes=15),
                            decided_by_id=world.admin.pk,
                            decided_at=at + timedelta(seconds=30),
                            decision_reason="ok",
                            created_at=at,
                        )
                    )
            with transaction.atomic():
                InvocationRecord.objects.bulk_create(records, batch_size=5_000)
                RunEvent.objects.bulk_create(events, batch_size=5_000)
                ApprovalRequest.objects.bulk_create(approvals, batch_size=5_000)
            counts["records"] += len(records)
            counts["events"] += len(events)
            counts["approvals"] += len(approvals)
    world.records = target
    world.approvals += counts["approvals"]
    analyze()
    return {**counts, "seconds": round(time.perf_counter() - start, 1)}


def grow_in_sql(world: World, target: int, run_calls: int) -> dict[str, Any]:
    """What grow() writes, made by the database: INSERT .. SELECT over a series of i
    (bench/history.py's _insert_series), SQL_BATCH records a statement, each with its
    three events and one approval in APPROVAL_EVERY. Ids are derived from i, so an
    approval names its record without reading it back."""
    from django.db import connection

    from apps.invocations.rollups import fold_all
    from bench.history import _sql_time

    start = time.perf_counter()
    postgresql = connection.vendor == "postgresql"
    first, counts = world.records, {"records": 0, "events": 0, "approvals": 0}
    if target <= first:
        return {**counts, "seconds": 0.0}
    now = datetime.now(UTC)
    # i counts from the oldest; spread over the year, 0 long ago, target ~now (as grow()).
    at = _sql_time(
        postgresql, now - YEAR - timedelta(minutes=5), f"i * {YEAR.total_seconds() / target!r}"
    )
    later = _sql_time(
        postgresql,
        now - YEAR - timedelta(minutes=5),
        f"i * {YEAR.total_seconds() / target!r} + 0.003",
    )
    long_run = max(0, min(run_calls - world.long_run_calls, target - first))
    long_end = first + long_run  # records [first, long_end) go to the long run
    long_base = world.long_run_calls - first  # its call number is i + long_base
    tenants = " ".join(f"WHEN {k} THEN {pk}" for k, pk in enumerate(world.tenant_ids))
    tenant = (
        f"CASE WHEN i < {long_end} THEN {world.agent.tenant.pk} "
        f"ELSE CASE i % {TENANTS} {tenants} END END"
    )
    # An ordinary run: as grow(), RUN_LENGTH calls of one tenant, in turn.
    run = (
        f"CASE WHEN i < {long_end} THEN '{LONG_RUN}' "
        f"ELSE 'run-' || (i / {RUN_LENGTH * TENANTS}) || '-' || (i % {TENANTS}) END"
    )
    seq0 = (
        f"(CASE WHEN i < {long_end} THEN (i + {long_base}) * 3 "
        f"ELSE ((i / {TENANTS}) % {RUN_LENGTH}) * {EVENTS_PER_RECORD} END)"
    )
    record_id = (
        "CAST('b' || lpad(to_hex(i), 31, '0') AS uuid)" if postgresql else "printf('b%031x', i)"
    )
    true = "TRUE" if postgresql else "1"

    def as_json(text: str) -> str:  # an expression made of text (a literal alone needs none)
        return f"CAST({text} AS jsonb)" if postgresql else text

    tool = "'core__get_current_time'"
    records = {
        "id": record_id,
        "tenant_id": tenant,
        "tool_id": tool,
        "tool_ref": tool,
        "tool_call_id": "'call-' || i",
        "run_id": run,
        "principal": "'agent:a' || (i % 7)",
        "status": "'succeeded'",
        "ok": true,
        "args": "'{}'",
        "result": '\'{"iso": "2026-01-01T00:00:00+00:00"}\'',
        "policy_rule": "'allow'",
        "created_at": at,
        "started_at": at,
        "ended_at": later,
        "duration_ms": "3",
    }
    kind = (
        "CASE k WHEN 1 THEN 'tool_call_start' WHEN 2 THEN 'tool_call_progress' "
        "ELSE 'tool_call_result' END"
    )
    events = {
        "tenant_id": tenant,
        "run_id": run,
        "seq": f"{seq0} + k",
        "type": kind,
        "tool_call_id": "'call-' || i",
        "tool_id": tool,
        "message": as_json(
            f'\'{{"type": "\' || {kind} || \'", "seq": \' || ({seq0} + k) || '
            f'\', "runId": "\' || {run} || \'", "toolCallId": "call-\' || i || '
            '\'", "toolId": "core__get_current_time"}\''
        ),
        "at": at,
    }
    approvals = {
        "id": record_id.replace("'b'", "'a'").replace("'b%031x'", "'a%031x'"),
        "tenant_id": tenant,
        "invocation_id": record_id,
        "tool_id": tool,
        "status": "'succeeded'",
        "principal": "'agent:a' || (i % 7)",
        "requested_by_id": str(world.admin.pk),
        "run_id": run,
        "tool_call_id": "'call-' || i",
        "args": "'{}'",
        "original_args": "'{}'",
        "args_diff": "'[]'",
        "bound_hash": "'" + "0" * 64 + "'",
        "hold_reason": "'bench'",
        "expires_at": at,
        "decided_by_id": str(world.admin.pk),
        "decided_at": later,
        "decision_reason": "'ok'",
        "created_at": at,
    }
    kinds = " CROSS JOIN (SELECT 1 AS k UNION ALL SELECT 2 UNION ALL SELECT 3) AS kinds"
    with audit_chain_off(postgresql):
        write_series(records, events, approvals, kinds, first, target, postgresql, start)
    written = target - first
    made = len(range(first + (-first) % APPROVAL_EVERY, target, APPROVAL_EVERY))
    counts = {"records": written, "events": written * EVENTS_PER_RECORD, "approvals": made}
    world.long_run_calls += long_run
    world.records = target
    world.approvals += made
    # The triggers queued every end for the sweeper, as real calls do; fold them now, as
    # a worker would have over the year, so an idle pass measures an idle pass.
    fold_old_ends()
    while fold_all().ends:
        pass
    analyze()
    return {**counts, "seconds": round(time.perf_counter() - start, 1)}


def fold_old_ends() -> int:
    """The queued ends of calls older than any minute the rollups keep, added to CallTotal
    by one aggregate and deleted, in one transaction: what the sweeper would have folded
    2,000 at a time over the year (5,000 transactions at 10⁷ records). The totals are the
    fold's (rollups.Tally, rollups._apply); there is no per-minute row to add (older than
    MINUTES_KEPT) and nothing to repair (every synthetic record has its tool_call_result).
    The last day's ends are left to fold_all, the sweeper's own code."""
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.invocations import rollups
    from apps.invocations.models import CallEnd, CallTotal

    table = connection.ops.quote_name(CallEnd._meta.db_table)
    buckets = ", ".join(
        f"SUM(CASE WHEN duration_ms <= {round(bound * 1000)} THEN sign ELSE 0 END)"
        for bound in rollups.LATENCY_BUCKETS
    )
    cutoff = timezone.now() - rollups.MINUTES_KEPT
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT tenant_id, tool_ref, status, SUM(sign), "  # noqa: S608 (names only)
            "SUM(CASE WHEN duration_ms IS NULL THEN 0 ELSE sign END), "
            f"SUM(sign * COALESCE(duration_ms, 0)), {buckets} FROM {table} "
            "WHERE ended_at < %s GROUP BY tenant_id, tool_ref, status",
            [cutoff],
        )
        groups = cursor.fetchall()
        for tenant_id, tool_ref, status, calls, timed_, sum_ms, *counts in groups:
            delta = rollups.Tally()
            delta.merge(int(calls), int(timed_), int(sum_ms), counts)
            row, _ = CallTotal.objects.select_for_update().get_or_create(
                tenant_id=tenant_id, tool_ref=tool_ref, status=status, defaults={"buckets": []}
            )
            rollups._apply(row, delta)
            row.save(update_fields=rollups.ROLLED_UP)
        cursor.execute(f"DELETE FROM {table} WHERE ended_at < %s", [cutoff])  # noqa: S608
        return cursor.rowcount


def write_series(
    records: dict[str, str],
    events: dict[str, str],
    approvals: dict[str, str],
    kinds: str,
    first: int,
    target: int,
    postgresql: bool,
    start: float,
) -> None:
    from django.db import connection, transaction

    from apps.approvals.models import ApprovalRequest
    from apps.invocations.models import InvocationRecord, RunEvent
    from bench.history import _insert_series

    for lo in range(first, target, SQL_BATCH):
        hi = min(target, lo + SQL_BATCH) - 1
        with transaction.atomic(), connection.cursor() as cursor:
            _insert_series(cursor, InvocationRecord, records, lo, hi, postgresql, "")
            _insert_series(cursor, RunEvent, events, lo, hi, postgresql, kinds)
            _insert_series(
                cursor,
                ApprovalRequest,
                approvals,
                lo,
                hi,
                postgresql,
                # i % n, spelled without '%' (this part is not escaped for parameters)
                f" WHERE i - (i / {APPROVAL_EVERY}) * {APPROVAL_EVERY} = 0",
            )
        say(f"  {hi + 1:,} records written ({time.perf_counter() - start:.0f} s)")


@contextmanager
def audit_chain_off(postgresql: bool) -> Iterator[None]:
    """History written as if from before the audit chain began: linking each row (a
    trigger per row, bench/audit.py measures its cost per call) would make the build
    hours long, and a call's own linking does not grow with history (one head per
    tenant). verify_audit reports these rows as unlinked; this is a throwaway database."""
    from django.db import connection

    from apps.audit import digests

    inserts = ((digests.RECORDS, "audit_record_written"), (digests.EVENTS, "audit_event_written"))

    def run(statements: Iterable[str]) -> None:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)

    if postgresql:
        run(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}" for table, trigger in inserts)
    else:
        run(digests.SQLITE_DROP)
    try:
        yield
    finally:
        if postgresql:
            run(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}" for table, trigger in inserts)
        else:
            run(digests.sqlite_triggers())


def analyze() -> None:
    """Statistics, and on PostgreSQL a VACUUM as autovacuum would have run over a year:
    the fold's one DELETE of millions of queued ends leaves as many dead rows in the
    queue, which every read of it (the sweeper, /metrics, the overview) walks until
    vacuumed (at 10⁷ a scrape took 565 ms before, not vacuumed). On SQLite, the
    write-ahead log checkpointed as its automatic checkpoints (every 1,000 pages) would
    have (the build left it at 344 MB at 10⁶, which a live deployment's never holds, and
    a reader looks each page up in its index first)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("VACUUM (ANALYZE)")
        else:
            cursor.execute("ANALYZE")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def build_catalog(world: World, tools: int, rules: int) -> dict[str, Any]:
    """`tools` enabled tools the bench tenant's agents may execute, and `rules` policies
    (each listing 10 of them; one in ten with a condition)."""
    from django.contrib.contenttypes.models import ContentType
    from guardian.models import GroupObjectPermission

    from apps.policies.models import Policy
    from apps.tenants.principals import agents_group
    from apps.tools.models import Tool

    start = time.perf_counter()
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    Tool.objects.bulk_create(
        [
            Tool(
                id=f"bench__tool_{i:05}",
                name=f"tool_{i:05}",
                description=f"Synthetic tool {i}",
                input_schema=schema,
                schema_hash=f"{i:016x}",
                effect="read_only",
                consequence_level="low",
                source="core",
                enabled=True,
            )
            for i in range(tools)
        ],
        batch_size=5_000,
    )
    group = agents_group(world.agent.tenant)
    kind = ContentType.objects.get_for_model(Tool)
    from django.contrib.auth.models import Permission

    perm = Permission.objects.get(codename="execute_tool", content_type=kind)
    GroupObjectPermission.objects.bulk_create(
        [
            GroupObjectPermission(
                group=group, permission=perm, content_type=kind, object_pk=f"bench__tool_{i:05}"
            )
            for i in range(tools)
        ],
        batch_size=5_000,
    )
    policies = Policy.objects.bulk_create(
        [Policy(tenant=world.agent.tenant, name=f"rule {i}") for i in range(rules)],
        batch_size=1_000,
    )
    through = Policy.tools.through
    through.objects.bulk_create(
        [
            through(policy_id=p.pk, tool_id=f"bench__tool_{(i * 10 + k) % tools:05}")
            for i, p in enumerate(policies)
            for k in range(10)
        ],
        batch_size=5_000,
    )
    from apps.tenants.epoch import POLICIES_ROW, bump, bump_row

    bump()
    bump_row(POLICIES_ROW)  # listings written straight into the m2m table: no signal
    return {"tools": tools, "rules": rules, "seconds": round(time.perf_counter() - start, 1)}


# ------------------------------------------------------------------ measuring


@contextmanager
def server_loop() -> Iterator[None]:
    """A running event loop that this process's channel-layer sends are handed to, as they
    are to Daphne's loop when deployed (apps.invocations.events._group_send: a request's
    thread hands its pushes to the server's loop). Without one, each push made here
    would start and close an event loop of its own, a cost no deployed request pays."""
    import asyncio
    import threading

    from apps.invocations.events import remember_server_loop

    global _server_loop
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-server-loop", daemon=True)
    thread.start()

    async def remember() -> None:
        remember_server_loop()

    asyncio.run_coroutine_threadsafe(remember(), loop).result(timeout=10)
    _server_loop = loop
    try:
        yield
    finally:
        _server_loop = None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


_server_loop: Any = None


def on_server_loop[T](coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an ASGI exchange on the server loop, as Daphne runs every request on its own:
    the application remembers the loop it is called on (toolhub/asgi.py), and one run by
    async_to_sync (a loop of its own, closed after) left the process's pushes without a
    running loop, each then paying for a loop of its own (a call 1 ms more, measured)."""
    import asyncio

    from asgiref.sync import async_to_sync

    if _server_loop is None:
        return async_to_sync(coroutine)()
    return asyncio.run_coroutine_threadsafe(coroutine(), _server_loop).result(timeout=600)


def measure(
    world: World, samples: int, deep: int, explain: bool, idle: float = 0.0
) -> dict[str, Any]:
    from django.test import Client

    from apps.invocations.models import InvocationRecord

    api = Client(HTTP_AUTHORIZATION=f"Bearer {world.agent.key}", HTTP_HOST="localhost")
    staff = Client(HTTP_HOST="localhost")
    staff.force_login(world.admin)
    out: dict[str, Any] = {}

    def get(client: Client, path: str, **params: Any) -> Callable[[], Any]:
        def go() -> Any:
            response = client.get(path, params)
            assert response.status_code == 200, (path, response.status_code, response.content[:300])
            return response

        return go

    def post_call() -> None:
        response = api.post(
            "/api/v1/invocations/",
            {"toolId": "core__get_current_time"},
            content_type="application/json",
        )
        assert response.status_code in (200, 201), response.content[:300]

    # A p99 needs a few hundred calls: of 45 it was their slowest. They are taken in
    # CALL_BLOCKS blocks spread over the level's measurement: 300 calls in a row last a
    # second, and one second of the VM's slowdown moved a level's p50 by 17 %.
    post_call()  # warm: caches, plans
    per_block = max(samples * 3, CALL_SAMPLES) // CALL_BLOCKS
    call_times: list[float] = []

    def call_block() -> None:
        call_times.extend(times_of(post_call, per_block))

    call_block()
    out["dry_run"] = timed(
        lambda: api.post(
            "/api/v1/simulations/",
            {"toolId": "core__get_current_time"},
            content_type="application/json",
        ),
        samples,
    )

    out["decision_request"] = decision_requests(world, staff, samples)

    def deep_cursor(path: str) -> str | None:
        """The cursor of the page after ~`deep` rows (following next links, 200 a page)."""
        url: str | None = path + "?page_size=200" if "approvals" not in path else path
        seen = 0
        while url and seen < deep:
            body = api.get(url).json()
            seen += len(body["results"])
            url = body["next"]
        return url

    for name, path in (
        ("invocations", "/api/v1/invocations/"),
        ("approvals", "/api/v1/approvals/"),
    ):
        out[f"api_{name}_first"] = timed(get(api, path), samples)
        cursor_url = deep_cursor(path)
        if cursor_url:
            out[f"api_{name}_deep"] = timed(get(api, cursor_url), samples)
    out["api_connections"] = timed(get(api, "/api/v1/connections/"), samples)

    from apps.approvals.models import ApprovalRequest
    from apps.invocations.models import RunEvent
    from apps.policies.models import Policy
    from apps.tools.models import Tool
    from toolhub.web.paging import COUNT_CAP

    admins = {
        "records": ("/admin/invocations/invocationrecord/", InvocationRecord),
        "events": ("/admin/invocations/runevent/", RunEvent),
        "approvals": ("/admin/approvals/approvalrequest/", ApprovalRequest),
        "tools": ("/admin/tools/tool/", Tool),
        "policies": ("/admin/policies/policy/", Policy),
    }
    some = InvocationRecord.objects.order_by().values_list("run_id", flat=True).first() or "none"
    for name, (path, model) in admins.items():
        out[f"admin_{name}"] = timed(get(staff, path), samples)
        rows = min(model._default_manager.order_by()[: COUNT_CAP + 1].count(), COUNT_CAP)
        last = (rows + 99) // 100  # ?p= counts from 1 (100 rows a page)
        if last > 1:
            page = min(last, deep // 100 + 1)
            out[f"admin_{name}_deep"] = timed(get(staff, path, p=str(page)), samples)
        out[f"admin_{name}_search_id"] = timed(get(staff, path, q=some), samples)
        out[f"admin_{name}_search_text"] = timed(get(staff, path, q="agent"), samples)

    call_block()
    out["console_history"] = timed(get(staff, "/console/history/"), samples)
    before = None
    for _ in range(max(1, deep // 50)):
        listed = staff.get("/console/history/", {"before": before} if before else {})
        text = listed.content.decode()
        marker = "before="
        if marker not in text:
            break
        from html import unescape
        from urllib.parse import unquote

        before = unquote(unescape(text.split(marker, 1)[1].split('"', 1)[0]))
    if before:
        out["console_history_deep"] = timed(get(staff, "/console/history/", before=before), samples)

    out["catalog_cold"], out["catalog"] = catalog_timings(api, samples)
    out["mcp_tools_list"] = mcp_tools_list(world, samples)
    out["replay"] = replay(world) if world.long_run_calls else None

    # The sweeper, /metrics and the overview are helper flatcost's (issue 45): measured
    # here as the tree has them; a failure is reported, not fatal.
    for key, fn in (
        ("sweep", sweep_once),
        ("metrics", get(staff, "/metrics")),
        ("overview", get(staff, "/console/overview/data/")),
    ):
        try:
            out[key] = timed(fn, max(3, samples // 3))
        except Exception as exc:
            out[key] = {"error": repr(exc)[:300]}
    call_block()
    out["call"] = summary(call_times)
    if idle:  # an embedded Daphne on this database, its worker and sweeper threads idle
        from bench.history import idle_cpu

        out["idle_cpu_pct"] = idle_cpu(dict(os.environ), idle, say)
    if explain:
        out["explain"] = explains(world)
    return out


def decision_requests(world: World, staff: Any, samples: int) -> dict[str, float]:
    """An operator's approval (`POST /api/v1/approvals/<id>/decision/`, as the console
    sends it) of a call held a moment before; only the decision request is timed."""
    from django.test import Client

    held = Client(HTTP_AUTHORIZATION=f"Bearer {world.held.key}", HTTP_HOST="localhost")
    times = []
    for n in range(samples + 1):  # the first warms up
        response = held.post(
            "/api/v1/invocations/",
            {"toolId": "core__get_current_time", "runId": f"run-held-{uuid.uuid4().hex[:8]}"},
            content_type="application/json",
        )
        assert response.status_code == 202, response.content[:300]
        approval = response.json()["approvalId"]
        start = time.perf_counter()
        decided = staff.post(
            f"/api/v1/approvals/{approval}/decision/",
            {"decision": "approve", "reason": "bench"},
            content_type="application/json",
        )
        elapsed = (time.perf_counter() - start) * 1000
        assert decided.status_code == 200, decided.content[:300]
        if n:
            times.append(elapsed)
    return {
        "p50": round(statistics.median(times), 2),
        "p95": round(percentile(times, 95), 2),
        "p99": round(percentile(times, 99), 2),
        "n": samples,
    }


def sweep_once() -> None:
    from apps.approvals import tasks

    tasks.sweep()


def catalog_timings(api: Any, samples: int) -> tuple[dict[str, float], dict[str, float]]:
    from apps.tenants.epoch import bump

    def cold() -> None:
        bump()
        response = api.get("/api/v1/tools/")
        assert response.status_code == 200

    def warm() -> None:
        assert api.get("/api/v1/tools/").status_code == 200

    listed = len(api.get("/api/v1/tools/").json()["tools"]) if samples else 0
    cold_t = timed(cold, max(3, samples // 3))
    warm_t = timed(warm, samples)
    cold_t["listed"] = warm_t["listed"] = listed
    return cold_t, warm_t


def catalog_only(world: World, api: Any, samples: int) -> dict[str, Any]:
    """The catalog's figures alone (`--catalog-only`): cold and warm through the API, cold
    after each kind of change (`catalog_cold_after`: a bare bump() changes the
    authorization epoch alone, a real edit changes what is below it too), MCP tools/list
    warm and cold (the first page after an authorization change, and after a grant)."""
    from apps.tenants.epoch import bump

    figures: dict[str, Any] = {}
    figures["catalog_cold"], figures["catalog"] = catalog_timings(api, samples)
    changes = catalog_changes(world)
    figures["catalog_cold_after"] = {
        kind: catalog_cold_after(api, change, max(3, samples // 3))
        for kind, change in changes.items()
    }
    figures["mcp_tools_list"] = mcp_tools_list(world, samples)
    figures["mcp_tools_list_cold"] = mcp_tools_list(world, max(3, samples // 3), before=bump)
    figures["mcp_tools_list_cold_grant"] = mcp_tools_list(
        world, max(3, samples // 3), before=changes["grant added"]
    )
    return figures


def catalog_changes(world: World) -> dict[str, Callable[[], None]]:
    """One edit of each kind that changes the authorization epoch, in the bench tenant:
    each alternates between two states so that every sample changes something."""
    from django.contrib.auth.models import Group
    from guardian.shortcuts import assign_perm, remove_perm

    from apps.policies.models import Policy
    from apps.tenants.principals import agents_group
    from apps.tools.models import Tool
    from tests.connections import make_connection

    tenant = world.agent.tenant
    policy = Policy.objects.filter(tenant=tenant).order_by("pk").last()
    assert policy is not None
    group: Group = agents_group(tenant)
    granted = Tool.objects.get(pk="bench__tool_00001")
    connection = make_connection(tenant, name="bench")
    turn = [0]

    def flip() -> int:
        turn[0] += 1
        return turn[0] % 2

    def policy_edited() -> None:
        policy.four_eyes = bool(flip())
        policy.save()

    def grant_added() -> None:
        if flip():
            remove_perm("tools.execute_tool", group, granted)
        else:
            assign_perm("tools.execute_tool", group, granted)

    def tool_edited() -> None:
        Tool.objects.filter(pk="bench__tool_00002").update(description=f"Edited {flip()}")

    def connection_edited() -> None:
        connection.allowed_hosts = ["api.example.com"] + (["b.example.com"] if flip() else [])
        connection.save()

    return {
        "policy edited": policy_edited,
        "grant added": grant_added,
        "tool edited": tool_edited,
        "connection edited": connection_edited,
    }


def catalog_cold_after(api: Any, change: Callable[[], None], samples: int) -> dict[str, float]:
    """The first catalog after `change` (the edit's own time off the clock)."""

    def cold() -> None:
        assert api.get("/api/v1/tools/").status_code == 200

    return timed(cold, samples, before=change)


def asgi_http(path: str, body: Any, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    from asgiref.testing import ApplicationCommunicator

    from toolhub.asgi import application

    raw = json.dumps(body).encode()

    async def go() -> tuple[int, dict[str, str], bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "scheme": "http",
            "server": ("localhost", 80),
            "client": ("127.0.0.1", 40000),
            "headers": [(b"host", b"localhost"), (b"content-length", str(len(raw)).encode())]
            + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": raw, "more_body": False})
        start = await app.receive_output(60)
        chunks = []
        while True:
            message = await app.receive_output(60)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await app.wait(5)
        heads = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        return start["status"], heads, b"".join(chunks)

    return on_server_loop(go)


def mcp_tools_list(
    world: World, samples: int, before: Callable[[], None] | None = None
) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {world.agent.key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    status, heads, text = asgi_http("/mcp/", init, headers)
    if status != 200:
        return {"error": f"initialize answered {status}: {text[:200]!r}"}
    session = {**headers, "Mcp-Session-Id": heads.get("mcp-session-id", "")}
    listed = 0

    def one() -> None:
        nonlocal listed
        status, _, text = asgi_http(
            "/mcp/", {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session
        )
        assert status == 200, text[:200]
        listed = len(json.loads(text)["result"]["tools"])

    result: dict[str, Any] = timed(one, samples, before=before)
    result["listed_first_page"] = listed
    return result


def replay(world: World) -> dict[str, Any]:
    """A run stream from after=0 over the long run, in process; the queries it made."""
    from channels.testing import WebsocketCommunicator
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from toolhub.asgi import application

    expected = world.long_run_calls * EVENTS_PER_RECORD

    async def go() -> int:
        ws = WebsocketCommunicator(
            application,
            f"/ws/v1/runs/{LONG_RUN}/?after=0",
            headers=[
                (b"authorization", f"Bearer {world.agent.key}".encode()),
                (b"host", b"localhost"),
            ],
        )
        connected, _ = await ws.connect(timeout=30)
        assert connected
        got = 0
        while got < expected:
            await ws.receive_from(timeout=60)
            got += 1
        await ws.disconnect()
        return got

    start = time.perf_counter()
    got = on_server_loop(go)
    seconds = time.perf_counter() - start
    del connection, CaptureQueriesContext
    return {"events": got, "seconds": round(seconds, 2), "events_per_s": round(got / seconds)}


def explains(world: World) -> dict[str, str]:
    """PostgreSQL's plans for the deep pages and the admin's first page."""
    from django.db import connection

    from apps.approvals.models import ApprovalRequest
    from apps.invocations.models import InvocationRecord

    if connection.vendor != "postgresql":
        return {}
    tenant = world.agent.tenant.pk
    some = (
        InvocationRecord.objects.filter(tenant_id=tenant).order_by("-created_at")[5000:5001].first()
    )
    at = some.created_at if some else datetime.now(UTC)
    queries = {
        "api_invocations_deep": InvocationRecord.objects.filter(
            tenant_id=tenant, created_at__lt=at
        ).order_by("-created_at")[:51],
        "admin_records_superuser": InvocationRecord.objects.order_by("-created_at", "-id")[
            9900:10000
        ],
        "admin_records_count": InvocationRecord.objects.order_by()[:10001],
        "api_approvals_first": ApprovalRequest.objects.filter(tenant_id=tenant).order_by(
            "-created_at"
        )[:51],
    }
    queries.update(admin_search_queries(world))
    plans = {}
    for name, queryset in queries.items():
        plans[name] = queryset.explain(analyze=True)
    return plans


def admin_search_queries(world: World) -> dict[str, Any]:
    """The events changelist's exact-id search (the run id `measure` searches), its page
    and its capped count, as the admin makes them for the superuser."""
    from django.contrib import admin
    from django.test import RequestFactory

    from apps.invocations.models import InvocationRecord, RunEvent
    from toolhub.web.paging import COUNT_CAP

    some = InvocationRecord.objects.order_by().values_list("run_id", flat=True).first() or "none"
    request = RequestFactory().get("/admin/invocations/runevent/", {"q": some})
    request.user = world.admin
    model_admin = admin.site._registry[RunEvent]
    found, _ = model_admin.get_search_results(request, model_admin.get_queryset(request), some)
    ordering = model_admin.get_ordering(request) or ("-pk",)
    return {
        "admin_events_search_id_page": found.order_by(*ordering)[:100],
        "admin_events_search_id_count": found.order_by()[: COUNT_CAP + 1],
    }


# ------------------------------------------------------------------ the report

GOALS: list[tuple[str, str, Callable[[dict[str, Any], dict[str, Any]], bool | None]]] = []


def verdicts(level: dict[str, Any], empty: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []

    def row(label: str, value: Any, goal: str, met: bool | None) -> None:
        rows.append((label, value, goal, "" if met is None else ("MET" if met else "NOT MET")))

    def p(key: str, q: str = "p95") -> float | None:
        entry = level.get(key)
        return entry.get(q) if isinstance(entry, dict) else None

    call, base = level["call"], empty["call"]
    row("call p50 ms", call["p50"], "≤ 110 % of empty", call["p50"] <= base["p50"] * 1.1)
    row("call p99 ms", call["p99"], "≤ 110 % of empty", call["p99"] <= base["p99"] * 1.1)
    row("call p99/p50", round(call["p99"] / call["p50"], 2), "≤ 3 (from outside: calls.py)", None)
    row(
        "policy decision (dry run) p50 ms",
        p("dry_run", "p50"),
        "≤ 20",
        (p("dry_run", "p50") or 0) <= 20,
    )
    if level.get("decision_request"):
        value = p("decision_request", "p50")
        row("operator's decision request p50 ms", value, "≤ 20", value is not None and value <= 20)
    for key in sorted(level):
        if key.startswith(("api_", "admin_", "console_history")) and isinstance(level[key], dict):
            value = p(key)
            row(f"{key} p95 ms", value, "≤ 100", value is not None and value <= 100)
    for key in ("catalog", "catalog_cold", "mcp_tools_list"):
        value = p(key, "p50")
        listed = level[key].get("listed", level[key].get("listed_first_page"))
        row(
            f"{key} p50 ms ({listed} listed)",
            value,
            "≤ 20",
            value is not None and value <= 20,
        )
    if level.get("replay"):
        r = level["replay"]
        row(f"replay from 0: {r['events']} events, s", r["seconds"], "batched (100 a query)", None)
    for key, goal in (("sweep", None), ("metrics", 50.0), ("overview", 50.0)):
        if level.get(key):
            value = p(key, "p50")
            met = None if goal is None or value is None else value <= goal
            row(
                f"{key} p50 ms",
                value or level[key].get("error"),
                f"≤ {goal:g}" if goal else "flat",
                met,
            )
    if level.get("idle_cpu_pct") is not None:
        share = level["idle_cpu_pct"]
        row("idle process CPU, % of a core", share, "≤ 1", share <= 1.0)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", default="0,100000,1000000")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--rules", type=int, default=1_000)
    parser.add_argument("--run-calls", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--deep", type=int, default=5_000, help="rows before the deep page")
    parser.add_argument(
        "--idle", type=float, default=60.0, help="seconds an idle Daphne is watched (0: none)"
    )
    parser.add_argument(
        "--builder",
        choices=["sql", "orm"],
        default="sql",
        help="sql: rows made by the database (fast); orm: bulk_create",
    )
    parser.add_argument("--output")
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=None,
        metavar="LOAD",
        help="before measuring each level, wait (up to an hour) until the 1-minute load "
        "average is below LOAD: a long build can run beside other work, its figures not",
    )
    parser.add_argument(
        "--catalog-only",
        action="store_true",
        help="only the catalog and MCP tools/list (cold and warm), printed, not written",
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.records.split(",")]

    report: dict[str, Any] = {"database": args.database, "args": vars(args), "levels": {}}
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    output = Path(args.output) if args.output else RESULTS_DIR / f"scale-{day}-{args.database}.json"
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="toolhub-scale-") as tmp:
        setup_django(args.database, stack, Path(tmp))
        world = World()
        report["catalog_build"] = build_catalog(world, args.tools, args.rules)
        say(f"catalog: {report['catalog_build']}")
        if args.catalog_only:
            from django.test import Client

            api = Client(HTTP_AUTHORIZATION=f"Bearer {world.agent.key}", HTTP_HOST="localhost")
            figures = catalog_only(world, api, args.samples)
            say(json.dumps(figures, indent=1) + f"\nload average {os.getloadavg()}")
            return
        empty: dict[str, Any] | None = None
        for level in levels:
            built = grow(world, level, args.run_calls, args.builder)
            say(f"\n== {level:,} records ({args.database}); build {built}")
            if args.quiet_below is not None:
                settle(args.quiet_below)
            with server_loop():
                figures = measure(
                    world, args.samples, args.deep, explain=level == levels[-1], idle=args.idle
                )
            figures["build"] = built
            empty = empty or figures
            report["levels"][str(level)] = figures
            for label, value, goal, met in verdicts(figures, empty):
                say(f"  {label:<52} {value!s:>10}  {goal:<28} {met}")
            write(report, output)  # after each level: a long run keeps what it measured
    say(f"\nwrote {output}")


def settle(load: float, limit_s: float = 3600.0) -> None:
    """Wait until the machine is quiet enough to measure (or `limit_s` passed)."""
    end = time.monotonic() + limit_s
    while os.getloadavg()[0] >= load and time.monotonic() < end:
        time.sleep(10)
    say(f"  measuring at load average {os.getloadavg()}")


def write(report: dict[str, Any], output: Path) -> None:
    report["commit"] = subprocess.run(  # noqa: S603
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"],  # noqa: S607
        capture_output=True,
        text=True,
    ).stdout.strip()  # also in a git worktree, where .git is a file
    report["nproc"] = os.cpu_count()
    report["load_average"] = os.getloadavg()
    output.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
