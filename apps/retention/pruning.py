"""Pruning: finished calls past their tenant's retention leave in small batches.

A pass over a tenant takes at most PASS_LIMIT of its oldest finished calls (record,
approval, votes, run events), reading outside any transaction; if an export was asked,
it writes all of them first (apps.retention.export: a temporary file renamed at the
end), and only then deletes, `batch` records a transaction. On SQLite, where one writer
holds the database at a time, a transaction of a few hundred rows is a few
milliseconds: calls wait for it as for any other writer (toolhub/db/sqlite3/base.py).

What is never pruned: a call that is not finished (held, queued, running), a call whose
approval is still open, and the run events from the first event of such a call on:
a run's events leave as a prefix (seq 1 up to `through_seq`, remembered in PrunedRun),
so a replay either has every event after its `after` or is told with a 410 (4410)
that the ones it asked for are gone, never a silent gap.

Stream tickets past their expiry and finished background-task results older than
TASK_RESULTS_KEPT are deleted in the same pass, in batches too: they have their own
lifetimes and no tenant retention.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max, Min, Q
from django.tasks import TaskResultStatus
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.audit import chain
from apps.invocations.models import InvocationRecord, RunEvent, Status, StreamTicket
from apps.retention.models import PrunedId, PrunedRun, PruneMark, RetentionPolicy
from apps.tenants.models import Tenant

BATCH = 500
PASS_LIMIT = 20_000
TASK_RESULTS_KEPT = timedelta(days=7)

FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
OPEN_APPROVALS = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED, ApprovalStatus.EXECUTING)


class RetentionError(Exception):
    """Pruning refused or stopped; what was deleted, if anything, is in the message."""


@dataclass
class Totals:
    records: int = 0
    events: int = 0
    approvals: int = 0
    tickets: int = 0
    task_results: int = 0

    def add(self, other: Totals) -> None:
        for name in ("records", "events", "approvals", "tickets", "task_results"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def __str__(self) -> str:
        return (
            f"{self.records} records, {self.events} events, {self.approvals} approvals, "
            f"{self.tickets} stream tickets, {self.task_results} task results"
        )


@dataclass
class Chunk:
    """Up to `batch` records that may leave together, and their runs' event prefixes."""

    record_ids: list[Any]
    through: dict[str, int] = field(default_factory=dict)  # run id -> last seq pruned
    # run id -> the seq an earlier chunk of the pass prunes through (its events are not
    # this chunk's)
    floor: dict[str, int] = field(default_factory=dict)
    events: int = 0  # counted at planning (the dry run's figure)

    def prefixes(self) -> Q:
        """This chunk's events: per run, after the floor and through `through`."""
        condition = Q()
        for run_id, seq in self.through.items():
            condition |= Q(run_id=run_id, seq__gt=self.floor.get(run_id, 0), seq__lte=seq)
        return condition


def cutoff(tenant: Tenant, now: datetime) -> datetime | None:
    days = RetentionPolicy.objects.days_for(tenant)
    return None if days is None else now - timedelta(days=days)


def candidates(tenant: Tenant, before: datetime) -> Any:
    """The tenant's finished calls created before `before` whose approval is not open."""
    return (
        InvocationRecord.objects.filter(tenant=tenant, created_at__lt=before, status__in=FINISHED)
        .exclude(approval__status__in=OPEN_APPROVALS)
        .order_by("created_at", "pk")
    )


def plan(tenant: Tenant, before: datetime, batch: int, limit: int | None = None) -> list[Chunk]:
    """The chunks of one pass: oldest candidates first, each with the event prefix of its
    runs that may go (everything before the first event of a call that stays, and
    nothing written after `before`). A call with an event past that prefix waits.
    The calls of earlier chunks of the pass count as gone (they leave first)."""
    rows = list(
        candidates(tenant, before).values_list("pk", "run_id", "tool_call_id")[
            : limit or PASS_LIMIT
        ]
    )
    chunks = []
    leaving: set[Any] = set()
    through: dict[str, int] = {}
    for start in range(0, len(rows), batch):
        chunk = _plan_chunk(tenant, before, rows[start : start + batch], leaving, through)
        leaving.update(chunk.record_ids)
        through.update(chunk.through)
        if chunk.record_ids:
            chunks.append(chunk)
    return chunks


def _plan_chunk(
    tenant: Tenant,
    before: datetime,
    rows: list[tuple[Any, str, str]],
    leaving_before: set[Any],
    through_before: dict[str, int],
) -> Chunk:
    chosen = {pk for pk, _, _ in rows} | leaving_before
    runs = {run_id for _, run_id, _ in rows}
    events = RunEvent.objects.filter(tenant=tenant, run_id__in=runs)
    stats = {
        row["run_id"]: row
        for row in events.values("run_id").annotate(
            last=Max("seq"), first_recent=Min("seq", filter=Q(at__gte=before))
        )
    }
    # Calls of these runs that stay: their first events bound the prefix.
    staying = defaultdict(set)
    for pk, run_id, call in InvocationRecord.objects.filter(
        tenant=tenant, run_id__in=runs
    ).values_list("pk", "run_id", "tool_call_id"):
        if pk not in chosen:
            staying[run_id].add(call)
    first_staying: dict[str, int] = {}
    if staying:
        condition = Q()
        for run_id, calls in staying.items():
            condition |= Q(run_id=run_id, tool_call_id__in=calls)
        first_staying = dict(
            events.filter(condition)
            .values("run_id")
            .annotate(first=Min("seq"))
            .values_list("run_id", "first")
        )
    through: dict[str, int] = {}
    for run_id, row in stats.items():
        bounds = [row["last"]]
        if row["first_recent"] is not None:
            bounds.append(row["first_recent"] - 1)
        if run_id in first_staying:
            bounds.append(first_staying[run_id] - 1)
        through[run_id] = min(bounds)
    last_of_call = {
        (run_id, call): last
        for run_id, call, last in events.filter(tool_call_id__in={c for _, _, c in rows})
        .values("run_id", "tool_call_id")
        .annotate(last=Max("seq"))
        .values_list("run_id", "tool_call_id", "last")
    }
    leaving = [
        pk
        for pk, run_id, call in rows
        if last_of_call.get((run_id, call), 0) <= through.get(run_id, 0)
    ]
    floor = {run_id: through_before[run_id] for run_id in runs if run_id in through_before}
    chunk = Chunk(
        leaving,
        {run_id: seq for run_id, seq in through.items() if seq > floor.get(run_id, 0)},
        floor,
    )
    if chunk.through:
        chunk.events = events.filter(chunk.prefixes()).count()
    return chunk


def delete_chunk(tenant: Tenant, chunk: Chunk, mark: PruneMark) -> Totals:
    """One short transaction: the chunk's events, records, approvals; their tombstones."""
    totals = Totals()
    with transaction.atomic():
        # Re-read inside the transaction: only what is still finished leaves.
        records = list(
            InvocationRecord.objects.filter(pk__in=chunk.record_ids, status__in=FINISHED)
            .exclude(approval__status__in=OPEN_APPROVALS)
            .values_list("pk", flat=True)
        )
        approvals = list(
            ApprovalRequest.objects.filter(invocation_id__in=records).values_list("pk", flat=True)
        )
        if chunk.through:
            totals.events, _ = (
                RunEvent.objects.filter(tenant=tenant).filter(chunk.prefixes()).delete()
            )
            PrunedRun.objects.bulk_create(
                [
                    PrunedRun(tenant=tenant, run_id=run_id, through_seq=seq, mark=mark)
                    for run_id, seq in chunk.through.items()
                ],
                update_conflicts=True,
                unique_fields=["tenant", "run_id"],
                update_fields=["through_seq", "mark"],
            )
        InvocationRecord.objects.filter(pk__in=records).delete()  # approvals, votes cascade
        PrunedId.objects.bulk_create(
            [PrunedId(id=pk, kind=PrunedId.Kind.RECORD, mark=mark) for pk in records]
            + [PrunedId(id=pk, kind=PrunedId.Kind.APPROVAL, mark=mark) for pk in approvals],
            ignore_conflicts=True,
        )
        totals.records, totals.approvals = len(records), len(approvals)
        PruneMark.objects.filter(pk=mark.pk).update(
            records=mark.records + totals.records,
            events=mark.events + totals.events,
            approvals=mark.approvals + totals.approvals,
        )
        mark.records += totals.records
        mark.events += totals.events
        mark.approvals += totals.approvals
    return totals


def expire_tickets(batch: int, now: datetime, dry_run: bool = False) -> int:
    """Stream tickets past their expiry (used or not): they can open nothing."""
    expired = StreamTicket.objects.filter(expires_at__lt=now)
    if dry_run:
        return expired.count()
    return _delete_in_batches(expired, batch)


def forget_task_results(batch: int, now: datetime, dry_run: bool = False) -> int:
    """Finished background-task results (the approval queue's) older than a week."""
    finished = DBTaskResult.objects.filter(
        status__in=[TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED],
        finished_at__lt=now - TASK_RESULTS_KEPT,
    )
    if dry_run:
        return finished.count()
    return _delete_in_batches(finished, batch)


def _delete_in_batches(queryset: Any, batch: int) -> int:
    deleted = 0
    while True:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        with transaction.atomic():
            count, _ = queryset.model.objects.filter(pk__in=ids).delete()
        deleted += len(ids) if count else 0


Report = Callable[[str], None]


def prune(
    tenants: Iterable[Tenant] | None = None,
    *,
    exporter: Any = None,
    dry_run: bool = False,
    batch: int = BATCH,
    report: Report = lambda line: None,
    now: datetime | None = None,
) -> Totals:
    """Prune every tenant (or those given) to its retention; see the module docstring.

    `exporter` (apps.retention.export.Exporter) writes every record of a pass before
    any of them is deleted; if writing fails, that pass deletes nothing and
    RetentionError says what earlier passes removed.
    """
    if batch < 1:
        raise RetentionError("--batch must be at least 1.")
    now = now or timezone.now()
    totals = Totals()
    for tenant in tenants if tenants is not None else Tenant.objects.order_by("slug"):
        before = cutoff(tenant, now)
        if before is None:
            report(f"{tenant.slug}: kept forever (no retention set)")
            continue
        totals.add(_prune_tenant(tenant, before, exporter, dry_run, batch, report, now))
    tickets = expire_tickets(batch, now, dry_run)
    results = forget_task_results(batch, now, dry_run)
    totals.tickets += tickets
    totals.task_results += results
    verb = "would delete" if dry_run else "deleted"
    report(f"expired stream tickets: {verb} {tickets}; old task results: {verb} {results}")
    return totals


def _prune_tenant(
    tenant: Tenant,
    before: datetime,
    exporter: Any,
    dry_run: bool,
    batch: int,
    report: Report,
    now: datetime,
) -> Totals:
    totals = Totals()
    seen: set[Any] = set()
    while True:
        chunks = plan(tenant, before, batch)
        chunks = [chunk for chunk in chunks if not seen.issuperset(chunk.record_ids)]
        if not chunks:
            break
        if dry_run:
            for chunk in chunks:
                totals.records += len(chunk.record_ids)
                totals.events += chunk.events
                seen.update(chunk.record_ids)
            report(f"{tenant.slug}: would delete {totals.records} records, {totals.events} events")
            continue
        if exporter is not None:
            written = exporter.write(tenant, before, chunks)
            report(f"{tenant.slug}: exported {written} records")
        mark = PruneMark.objects.create(tenant=tenant, before=before, pruned_at=now)
        for chunk in chunks:
            done = delete_chunk(tenant, chunk, mark)
            totals.add(done)
            seen.update(chunk.record_ids)
            report(
                f"{tenant.slug}: deleted {totals.records} records, {totals.events} events, "
                f"{totals.approvals} approvals (before {before:%Y-%m-%d %H:%M})"
            )
        if not mark.records and not mark.events:
            mark.delete()
    if totals.records or totals.events:
        # The chain's positions of what left go too, leaving a checkpoint (apps.audit).
        chain.checkpoint(tenant, before)
    return totals
