"""Aggregates of the records and approvals, for the overview charts and /metrics.

Calls are read from rollups maintained as calls end (apps.invocations.rollups): CallTotal
for /metrics (per tenant, tool and status since the beginning), CallMinute for the
overview (per minute), plus the ends not folded yet. A scrape or an overview reads
O(tenants x tools x statuses) rows, whatever the history; every process's calls are in
them (they are written by the database in the statement that ends a record), and a
restart loses nothing. Calls not ended yet (held, queued, running) are read from the
records through a partial index that holds only them.

Latency percentiles come from the histogram buckets (stats.LATENCY_BUCKETS): the
answer is the upper bound of the bucket that holds the call of that rank (nearest rank),
so "p99 250 ms" means 99 % of the calls took at most 250 ms. Beyond the last bound (60 s)
the answer is that bound.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.invocations import rollups
from apps.invocations.models import (
    UNFINISHED_STATUSES,
    CallEnd,
    CallMinute,
    CallTotal,
    InvocationRecord,
    Status,
)
from apps.invocations.rollups import DENIALS, LATENCY_BUCKETS, Tally
from apps.tenants.models import Tenant
from apps.tools.models import Tool

LATENCY_SAMPLE = 20_000
TOP = 10


class Series(TypedDict):
    label: str
    data: list[int]


class Overview(TypedDict):
    generatedAt: str
    windowMinutes: int
    minutes: list[str]
    callsPerMinute: list[Series]
    latencyByTool: list[dict[str, Any]]
    pendingOverTime: list[int]
    pendingNow: int
    topDeniedTools: list[dict[str, Any]]
    topDeniedPrincipals: list[dict[str, Any]]


def overview(tenants: QuerySet[Tenant], minutes: int = 30) -> Overview:
    """What /console/overview/ draws: the last `minutes` minutes, one point a minute."""
    now = timezone.now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    slots = [start + timedelta(minutes=i) for i in range(minutes)]
    window = _minutes(tenants, start)
    return {
        "generatedAt": now.isoformat(),
        "windowMinutes": minutes,
        "minutes": [slot.isoformat() for slot in slots],
        "callsPerMinute": calls_per_minute(window, _unfinished(tenants, start), slots),
        "latencyByTool": latency_by_tool(window),
        "pendingOverTime": pending_over_time(tenants, slots),
        "pendingNow": pending_approvals(tenants),
        "topDeniedTools": top_denied(window, "tool_ref"),
        "topDeniedPrincipals": top_denied(window, "principal"),
    }


MINUTE_FIELDS = ("minute", "tool_ref", "status", "error_code", "principal")


def _minutes(tenants: QuerySet[Tenant], start: datetime) -> list[dict[str, Any]]:
    """The window's per-minute rollups of these tenants, the ends not folded yet added."""
    scope = tenants.values("pk")
    rows = list(
        CallMinute.objects.filter(minute__gte=start, tenant__in=scope).values(
            *MINUTE_FIELDS, "calls", "timed", "sum_ms", "buckets"
        )
    )
    queued = CallEnd.objects.filter(tenant__in=scope, ended_at__gte=start)
    for row in rollups.pending(queued, "minute", "tool_ref", "status", "error_code", "principal"):
        if row["error_code"] not in DENIALS:
            row["principal"] = ""
        rows.append(row)
    return rows


def _unfinished(tenants: QuerySet[Tenant], start: datetime) -> list[dict[str, Any]]:
    """Calls started in the window and not ended, per minute of their start and status
    (invocations_unfinished_idx: only such records are in it)."""
    rows: Any = (
        InvocationRecord.objects.filter(
            ended_at__isnull=True,
            status__in=UNFINISHED_STATUSES,
            tenant__in=tenants.values("pk"),
            created_at__gte=start,
        )
        .annotate(minute=TruncMinute("created_at"))
        .values("minute", "status")
        .annotate(calls=Count("pk"))
        .order_by()
    )
    return list(rows)


def calls_per_minute(
    window: list[dict[str, Any]], unfinished: list[dict[str, Any]], slots: list[datetime]
) -> list[Series]:
    """Per status, the calls that ended in each minute, and those still held, queued or
    running by the minute they started in."""
    counts: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    for row in [*window, *unfinished]:
        counts[row["status"]][row["minute"]] += row["calls"]
    return [
        {"label": status, "data": [counts[status].get(slot, 0) for slot in slots]}
        for status in Status.values
        if status in counts and any(counts[status].values())
    ]


def latency_by_tool(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """p50 and p99 of the calls that ended in the window, per tool, slowest p99 first,
    from the histogram buckets (see the module docstring). Only tools of the catalog: a
    call naming no tool (refused as unknown) is no tool's latency."""
    tallies: dict[str, Tally] = defaultdict(Tally)
    for row in window:
        tallies[row["tool_ref"]].merge(row["calls"], row["timed"], row["sum_ms"], row["buckets"])
    known = set(Tool.objects.filter(pk__in=list(tallies)).values_list("pk", flat=True))
    tallies = {tool: tally for tool, tally in tallies.items() if tool in known}
    rows: list[dict[str, Any]] = [
        {
            "tool": tool,
            "calls": tally.timed,
            "p50Ms": bucket_percentile(tally.buckets or [], tally.timed, 50),
            "p99Ms": bucket_percentile(tally.buckets or [], tally.timed, 99),
        }
        for tool, tally in tallies.items()
        if tally.timed > 0
    ]
    return sorted(rows, key=lambda row: (-int(row["p99Ms"]), str(row["tool"])))[:TOP]


def bucket_percentile(buckets: list[int], count: int, p: float) -> int:
    """Nearest-rank percentile from cumulative buckets, in milliseconds: the upper bound
    of the first bucket holding that many calls (the last bound if none does)."""
    rank = max(1, math.ceil(p / 100 * count))
    for bound, cumulative in zip(LATENCY_BUCKETS, buckets, strict=False):
        if cumulative >= rank:
            return int(bound * 1000)
    return int(LATENCY_BUCKETS[-1] * 1000)


def percentile(values: list[int], p: float) -> int:
    """Nearest-rank percentile (no interpolation: every answer is a real call's duration)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def pending_over_time(tenants: QuerySet[Tenant], slots: list[datetime]) -> list[int]:
    """How many approvals were waiting at the end of each minute.

    An approval waits from `created_at` until `decided_at` (set by every decision,
    expiry and cancellation) or, while still pending, until now.
    """
    from apps.approvals.models import ApprovalRequest

    if not slots:
        return []
    window_start = slots[0]
    # Found by when they were decided (approvals_decided_idx); when they were created is
    # compared below (none is created after the window, which ends with this minute).
    spans = ApprovalRequest.objects.filter(tenant__in=tenants.values("pk")).filter(
        Q(decided_at__isnull=True) | Q(decided_at__gte=window_start)
    )
    # Unordered: ordered newest first (the model's ordering), a planner may walk every
    # approval by approvals_newest_idx rather than read these few by approvals_decided_idx.
    pairs = list(spans.order_by().values_list("created_at", "decided_at")[:LATENCY_SAMPLE])
    now = timezone.now()
    points = []
    for slot in slots:
        moment = min(slot + timedelta(minutes=1), now)
        points.append(
            sum(
                1
                for created, decided in pairs
                if created <= moment and (decided is None or decided > moment)
            )
        )
    return points


def pending_approvals(tenants: QuerySet[Tenant]) -> int:
    from apps.approvals.models import ApprovalRequest

    return ApprovalRequest.objects.filter(tenant__in=tenants.values("pk")).pending().count()


def top_denied(window: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """The tools (or principals) refused most often by policy or permission."""
    counts: dict[str, int] = defaultdict(int)
    for row in window:
        if row["error_code"] in DENIALS:
            counts[row[field]] += row["calls"]
    ranked = sorted(((-n, name) for name, n in counts.items() if n > 0))[:TOP]
    return [{"name": name, "count": -n} for n, name in ranked]


# --------------------------------------------------------------------- /metrics


def call_totals() -> dict[tuple[str, str, str], Tally]:
    """Per tenant slug, tool and status: the rollup plus the ends not folded yet."""
    tallies: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
    rows: list[dict[str, Any]] = [
        dict(row)
        for row in CallTotal.objects.values(
            "tenant__slug", "tool_ref", "status", "calls", "timed", "sum_ms", "buckets"
        )
    ]
    rows += rollups.pending(CallEnd.objects.all(), "tenant__slug", "tool_ref", "status")
    for row in rows:
        key = (row["tenant__slug"], row["tool_ref"], row["status"])
        tallies[key].merge(row["calls"], row["timed"], row["sum_ms"], row["buckets"])
    return tallies


def calls_by_tool_and_outcome(
    totals: dict[tuple[str, str, str], Tally] | None = None,
) -> list[dict[str, Any]]:
    """Every call that ended, by tenant, tool and final status (refused calls included)."""
    return [
        {"tenant__slug": tenant, "tool_ref": tool, "status": status, "n": tally.calls}
        for (tenant, tool, status), tally in sorted((totals or call_totals()).items())
    ]


def calls_in_flight() -> list[dict[str, Any]]:
    """Calls not ended yet, by tenant, tool and status. The unfinished rows are read
    through invocations_unfinished_idx and counted here: grouped (or joined to the
    tenants) in SQL, SQLite's planner, once ANALYZE has run, walks the tenant index for
    the grouping's order, that is the whole history (1.3 s a scrape at 3 x 10^5 records,
    bench/scale.py); ungrouped it reads only the calls in flight."""
    counts = Counter(
        InvocationRecord.objects.filter(ended_at__isnull=True, status__in=UNFINISHED_STATUSES)
        .order_by()
        .values_list("tenant_id", "tool_ref", "status")
    )
    slugs = _slugs({tenant_id for tenant_id, _, _ in counts})
    return sorted(
        (
            {"tenant__slug": slugs[tenant_id], "tool_ref": tool, "status": status, "n": n}
            for (tenant_id, tool, status), n in counts.items()
            if tenant_id in slugs
        ),
        key=lambda row: (row["tenant__slug"], row["tool_ref"], row["status"]),
    )


def _slugs(tenant_ids: set[int]) -> dict[int, str]:
    if not tenant_ids:
        return {}
    return dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "slug"))


def latency_histograms(
    totals: dict[tuple[str, str, str], Tally] | None = None,
) -> list[dict[str, Any]]:
    """Per tenant and tool: cumulative bucket counts, the sum and count of durations of
    the calls that ended (exact: every call is in a bucket, none is sampled)."""
    per_tool: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for (tenant, tool, _status), tally in (totals or call_totals()).items():
        per_tool[(tenant, tool)].merge(0, tally.timed, tally.sum_ms, tally.buckets or [])
    return [
        {
            "tenant": tenant,
            "tool": tool,
            "count": tally.timed,
            "sum_seconds": tally.sum_ms / 1000,
            "buckets": list(zip(LATENCY_BUCKETS, _cumulative(tally.buckets), strict=True)),
        }
        for (tenant, tool), tally in sorted(per_tool.items())
        if tally.timed > 0
    ]


def _cumulative(buckets: list[int] | None) -> list[int]:
    return list(buckets or [0] * len(LATENCY_BUCKETS))


def pending_by_tenant() -> dict[str, int]:
    """Approvals waiting for a decision, per tenant slug: read by status, counted here
    (grouped in SQL, SQLite walks the whole table in the tenant index's order)."""
    from apps.approvals.models import ApprovalRequest

    counts = Counter(
        ApprovalRequest.objects.pending().order_by().values_list("tenant_id", flat=True)
    )
    slugs = _slugs(set(counts))
    return {slugs[pk]: n for pk, n in counts.items() if pk in slugs}


def queue_depth() -> dict[str, int]:
    """Tasks waiting for a worker (approved calls, notifications), per queue."""
    from django.tasks import TaskResultStatus
    from django_tasks_db.models import DBTaskResult

    rows = (
        DBTaskResult.objects.filter(status=TaskResultStatus.READY)
        .values("queue_name")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {row["queue_name"]: row["n"] for row in rows}
