"""Calls counted as they end, so that /metrics, the overview and the sweeper read what
happened since their last look instead of the whole history (issue 45).

A record that becomes final adds a row to the CallEnd queue in the same statement
(database triggers, migration 0007): every path that ends a call is covered, and an end
that rolled back leaves no row. `fold()` (the sweeper, every 10 s) deletes a batch of
the queue and, in that transaction, adds it to CallTotal (per tenant, tool and status,
since the beginning: /metrics) and CallMinute (per minute: the overview), then checks
that each of those calls has its tool_call_result and emits the ones missing. A crash
anywhere rolls the batch back into the queue; two sweepers take different batches
(PostgreSQL: SKIP LOCKED; SQLite: one writer at a time, and the delete comes first).

Readers add the rows not folded yet (`pending()`), so a number never lags the records;
a row is read either in the queue or in a rollup, never both (one transaction moves it).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, IntegerField, QuerySet, Sum, When
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.invocations.models import (
    CallEnd,
    CallMinute,
    CallTotal,
    ErrorCode,
    InvocationRecord,
    RunEvent,
)

logger = logging.getLogger(__name__)

# Seconds; the histograms' upper bounds (/metrics, the overview's percentiles).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DENIALS = (ErrorCode.POLICY_DENIED, ErrorCode.AUTHZ_DENIED)
# Queue rows one transaction folds, and batches one sweep folds at most (a backlog, such
# as after an outage of every worker, is worked off over several sweeps).
BATCH = 2000
BATCHES_PER_SWEEP = 25
# How long the per-minute rollups are kept (the overview draws the last 30 minutes).
MINUTES_KEPT = timedelta(days=1)


@dataclass
class Tally:
    """Calls, the timed ones among them, their summed duration and cumulative buckets."""

    calls: int = 0
    timed: int = 0
    sum_ms: int = 0
    buckets: list[int] | None = None

    def add(self, sign: int, duration_ms: int | None) -> None:
        self.calls += sign
        if duration_ms is None:
            return
        self.timed += sign
        self.sum_ms += sign * duration_ms
        if self.buckets is None:
            self.buckets = [0] * len(LATENCY_BUCKETS)
        for index, bound in enumerate(LATENCY_BUCKETS):
            if duration_ms <= bound * 1000:
                self.buckets[index] += sign

    def merge(self, calls: int, timed: int, sum_ms: int, buckets: Iterable[int]) -> None:
        self.calls += calls
        self.timed += timed
        self.sum_ms += sum_ms
        mine = self.buckets or [0] * len(LATENCY_BUCKETS)
        self.buckets = [a + b for a, b in zip(mine, _padded(buckets), strict=True)]


def _padded(buckets: Iterable[int]) -> list[int]:
    values = [int(value or 0) for value in buckets]
    return (values + [0] * len(LATENCY_BUCKETS))[: len(LATENCY_BUCKETS)]


@dataclass
class Folded:
    ends: int = 0
    repaired: int = 0


def fold_all(batches: int = BATCHES_PER_SWEEP) -> Folded:
    """The sweeper's pass: fold batches until the queue is empty (or `batches` were)."""
    done = Folded()
    for _ in range(batches):
        folded = fold()
        done.ends += folded.ends
        done.repaired += folded.repaired
        if folded.ends < BATCH:
            break
    return done


def fold(limit: int = BATCH) -> Folded:
    """Move up to `limit` queued ends into the rollups and repair their missing results,
    in one transaction."""
    with transaction.atomic():
        ends = _take(limit)
        if not ends:
            return Folded()
        _add_totals(ends)
        _add_minutes(ends)
        repaired = _repair_results(ends)
    return Folded(len(ends), repaired)


def _take(limit: int) -> list[CallEnd]:
    """Delete the oldest `limit` queue rows and answer them (DELETE .. RETURNING). On
    PostgreSQL concurrent folds skip each other's rows; on SQLite the delete takes the
    write lock first, so no other fold reads the same rows."""
    db = connections["default"]
    quote = db.ops.quote_name
    table = quote(CallEnd._meta.db_table)
    columns = ", ".join(quote(str(field.column)) for field in CallEnd._meta.concrete_fields)
    lock = " FOR UPDATE SKIP LOCKED" if db.vendor == "postgresql" else ""
    sql = (
        f"DELETE FROM {table} WHERE id IN "  # noqa: S608 (names, not values)
        f"(SELECT id FROM {table} ORDER BY id LIMIT %s{lock}) RETURNING {columns}"
    )
    return list(CallEnd.objects.raw(sql, [limit]))


def _add_totals(ends: list[CallEnd]) -> None:
    deltas: dict[tuple[int, str, str], Tally] = defaultdict(Tally)
    for end in ends:
        deltas[(end.tenant_id, end.tool_ref, end.status)].add(end.sign, end.duration_ms)
    keys = sorted(deltas)
    # Rows for new keys first (a concurrent fold may create the same: ignored), then every
    # row locked in key order, so two folds never wait on each other in a cycle.
    CallTotal.objects.bulk_create(
        [CallTotal(tenant_id=t, tool_ref=tool, status=s, buckets=[]) for t, tool, s in keys],
        ignore_conflicts=True,
    )
    rows = (
        CallTotal.objects.select_for_update()
        .filter(
            tenant_id__in={key[0] for key in keys},
            tool_ref__in={key[1] for key in keys},
            status__in={key[2] for key in keys},
        )
        .order_by("tenant_id", "tool_ref", "status")
    )
    for row in rows:
        delta = deltas.get((row.tenant_id, row.tool_ref, row.status))
        if delta is None:
            continue
        _apply(row, delta)
        row.save(update_fields=ROLLED_UP)  # a few rows: tools x statuses that ended


def _add_minutes(ends: list[CallEnd]) -> None:
    deltas: dict[tuple[datetime, int, str, str, str, str], Tally] = defaultdict(Tally)
    kept_from = timezone.now() - MINUTES_KEPT
    for end in ends:
        if end.ended_at is None or end.ended_at < kept_from:
            continue  # no end time (made final by hand), or older than any minute kept
        key = (
            end.ended_at.replace(second=0, microsecond=0),
            end.tenant_id,
            end.tool_ref,
            end.status,
            end.error_code,
            end.principal if end.error_code in DENIALS else "",
        )
        deltas[key].add(end.sign, end.duration_ms)
    if not deltas:
        return
    keys = sorted(deltas)
    CallMinute.objects.bulk_create(
        [
            CallMinute(
                minute=m,
                tenant_id=t,
                tool_ref=tool,
                status=s,
                error_code=e,
                principal=p,
                buckets=[],
            )
            for m, t, tool, s, e, p in keys
        ],
        ignore_conflicts=True,
    )
    rows = (
        CallMinute.objects.select_for_update()
        .filter(minute__in={key[0] for key in keys}, tenant_id__in={key[1] for key in keys})
        .filter(tool_ref__in={key[2] for key in keys})
        .order_by("minute", "tenant_id", "tool_ref", "status", "error_code", "principal")
    )
    for row in rows:
        delta = deltas.get(
            (row.minute, row.tenant_id, row.tool_ref, row.status, row.error_code, row.principal)
        )
        if delta is None:
            continue
        _apply(row, delta)
        row.save(update_fields=ROLLED_UP)


ROLLED_UP = ["calls", "timed", "sum_ms", "buckets"]


def _apply(row: CallTotal | CallMinute, delta: Tally) -> None:
    row.calls += delta.calls
    row.timed += delta.timed
    row.sum_ms += delta.sum_ms
    row.buckets = [
        a + b
        for a, b in zip(
            _padded(row.buckets), delta.buckets or [0] * len(LATENCY_BUCKETS), strict=True
        )
    ]


def _repair_results(ends: list[CallEnd]) -> int:
    """EVERY_RESULT_EMITTED: the runner writes a record's end and its tool_call_result
    together; a call that ended otherwise (a hand-written end, an older release) gets its
    result built from the record. One indexed read per batch (events_result_idx: a
    call's result without its run's other events)."""
    from apps.invocations import runner

    ended = {(end.tenant_id, end.run_id, end.tool_call_id): end for end in ends if end.sign > 0}
    if not ended:
        return 0
    found = set(
        RunEvent.objects.filter(
            type="tool_call_result",
            tenant_id__in={key[0] for key in ended},
            run_id__in={key[1] for key in ended},
            tool_call_id__in={key[2] for key in ended},
        ).values_list("tenant_id", "run_id", "tool_call_id")
    )
    missing = {end.record_id for key, end in ended.items() if key not in found}
    if not missing:
        return 0
    repaired = 0
    records = (
        InvocationRecord.objects.select_for_update(of=("self",))
        .filter(pk__in=missing, status__in=("succeeded", "failed", "cancelled"))
        .select_related("tenant")
        .order_by("pk")
    )
    for record in records:
        try:
            with transaction.atomic():
                logger.warning("emitting the missing tool_call_result of record %s", record.pk)
                runner.emit_result(record)
                repaired += 1
        except Exception:
            logger.exception("could not emit the tool_call_result of record %s", record.pk)
    return repaired


def forget_old_minutes(now: datetime | None = None) -> int:
    """Drop per-minute rollups older than MINUTES_KEPT (the leading column's range)."""
    cutoff = (now or timezone.now()) - MINUTES_KEPT
    deleted, _ = CallMinute.objects.filter(minute__lt=cutoff).delete()
    return deleted


# ---------------------------------------------------------------- reading


def _bucket_sums() -> dict[str, Any]:
    """Per bucket, the signed count of queued ends within it (cumulative, as stored)."""
    return {
        f"le_{index}": Sum(
            Case(
                When(duration_ms__lte=int(bound * 1000), then=F("sign")),
                default=0,
                output_field=IntegerField(),
            )
        )
        for index, bound in enumerate(LATENCY_BUCKETS)
    }


def pending(queue: QuerySet[CallEnd], *fields: str) -> list[dict[str, Any]]:
    """The queue rows not folded yet, grouped by `fields` (and `minute`, the end's minute,
    if named), with the rollups' columns: calls, timed, sum_ms, buckets. One grouped query
    over a table that holds what ended since the last sweep."""
    if "minute" in fields:
        queue = queue.filter(ended_at__isnull=False).annotate(minute=TruncMinute("ended_at"))
    rows = (
        queue.values(*fields)
        .annotate(
            calls=Sum("sign"),
            timed=Sum(
                Case(
                    When(duration_ms__isnull=False, then=F("sign")),
                    default=0,
                    output_field=IntegerField(),
                )
            ),
            sum_ms=Sum(F("sign") * F("duration_ms")),
            **_bucket_sums(),
        )
        .order_by()
    )
    return [
        {
            **{field: row[field] for field in fields},
            "calls": row["calls"] or 0,
            "timed": row["timed"] or 0,
            "sum_ms": row["sum_ms"] or 0,
            "buckets": [row[f"le_{index}"] or 0 for index in range(len(LATENCY_BUCKETS))],
        }
        for row in rows
    ]
