"""Aggregates of the records and approvals, for the overview charts and /metrics.

Everything is derived from the database when asked, never counted in memory: every
process (Daphne, workers) writes records, so only the database knows the totals, and a
restart loses nothing. Each function takes the tenants to cover (a staff member's, or all)
and runs a fixed number of grouped queries, whatever the number of rows.

Percentiles are computed in Python from at most LATENCY_SAMPLE recent durations per
window: SQLite has no percentile aggregate, and one code path serves both databases.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.invocations.models import ErrorCode, InvocationRecord, Status
from apps.tenants.models import Tenant

DENIALS = (ErrorCode.POLICY_DENIED, ErrorCode.AUTHZ_DENIED)
LATENCY_SAMPLE = 20_000
TOP = 10
# Seconds; the histogram's upper bounds (/metrics), and so what a dashboard can resolve.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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
    records = InvocationRecord.objects.filter(
        tenant__in=tenants.values("pk"), created_at__gte=start
    )
    return {
        "generatedAt": now.isoformat(),
        "windowMinutes": minutes,
        "minutes": [slot.isoformat() for slot in slots],
        "callsPerMinute": calls_per_minute(records, slots),
        "latencyByTool": latency_by_tool(records),
        "pendingOverTime": pending_over_time(tenants, slots),
        "pendingNow": pending_approvals(tenants),
        "topDeniedTools": top_denied(records, "tool_ref"),
        "topDeniedPrincipals": top_denied(records, "principal"),
    }


def calls_per_minute(records: QuerySet[InvocationRecord], slots: list[datetime]) -> list[Series]:
    """Calls started in each minute, one series per status (the call's outcome so far)."""
    counts: dict[str, dict[datetime, int]] = defaultdict(dict)
    rows = (
        records.annotate(minute=TruncMinute("created_at"))
        .values("minute", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for row in rows:
        counts[row["status"]][row["minute"]] = row["n"]
    return [
        {"label": status, "data": [counts[status].get(slot, 0) for slot in slots]}
        for status in Status.values
        if status in counts
    ]


def latency_by_tool(records: QuerySet[InvocationRecord]) -> list[dict[str, Any]]:
    """p50 and p99 of the calls that ran, per tool, slowest p99 first."""
    durations: dict[str, list[int]] = defaultdict(list)
    sample = (
        records.filter(duration_ms__isnull=False, started_at__isnull=False)
        .order_by("-created_at")
        .values_list("tool_ref", "duration_ms")[:LATENCY_SAMPLE]
    )
    for tool, duration in sample:
        if duration is not None:
            durations[tool].append(duration)
    rows: list[dict[str, Any]] = [
        {
            "tool": tool,
            "calls": len(values),
            "p50Ms": percentile(values, 50),
            "p99Ms": percentile(values, 99),
        }
        for tool, values in durations.items()
    ]
    return sorted(rows, key=lambda row: (-int(row["p99Ms"]), str(row["tool"])))[:TOP]


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
    spans = ApprovalRequest.objects.filter(
        tenant__in=tenants.values("pk"), created_at__lt=slots[-1] + timedelta(minutes=1)
    ).filter(Q(decided_at__isnull=True) | Q(decided_at__gte=window_start))
    pairs = list(spans.values_list("created_at", "decided_at")[:LATENCY_SAMPLE])
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


def top_denied(records: QuerySet[InvocationRecord], field: str) -> list[dict[str, Any]]:
    """The tools (or principals) refused most often by policy or permission."""
    rows = (
        records.filter(error_code__in=DENIALS)
        .values(field)
        .annotate(n=Count("pk"))
        .order_by("-n", field)[:TOP]
    )
    return [{"name": row[field], "count": row["n"]} for row in rows]


# --------------------------------------------------------------------- /metrics


def calls_by_tool_and_outcome() -> list[dict[str, Any]]:
    """Every call ever recorded, by tenant, tool and status (one grouped query)."""
    rows = (
        InvocationRecord.objects.values("tenant__slug", "tool_ref", "status")
        .annotate(n=Count("pk"))
        .order_by("tenant__slug", "tool_ref", "status")
    )
    return [dict(row) for row in rows]


def latency_histograms() -> list[dict[str, Any]]:
    """Per tenant and tool: cumulative bucket counts, the sum and count of durations.

    One grouped query with a conditional count per bucket, so the histogram is exact
    over all calls that ran, not a sample.
    """
    buckets = {
        f"le_{index}": Count("pk", filter=Q(duration_ms__lte=bound * 1000))
        for index, bound in enumerate(LATENCY_BUCKETS)
    }
    rows: Any = (
        InvocationRecord.objects.filter(duration_ms__isnull=False, started_at__isnull=False)
        .values("tenant__slug", "tool_ref")
        .annotate(count=Count("pk"), total_ms=Sum("duration_ms"), **buckets)
        .order_by("tenant__slug", "tool_ref")
    )
    return [
        {
            "tenant": row["tenant__slug"],
            "tool": row["tool_ref"],
            "count": row["count"],
            "sum_seconds": (row["total_ms"] or 0) / 1000,
            "buckets": [(bound, row[f"le_{index}"]) for index, bound in enumerate(LATENCY_BUCKETS)],
        }
        for row in rows
    ]


def pending_by_tenant() -> dict[str, int]:
    from apps.approvals.models import ApprovalRequest

    rows = (
        ApprovalRequest.objects.pending().values("tenant__slug").annotate(n=Count("pk")).order_by()
    )
    return {row["tenant__slug"]: row["n"] for row in rows}


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
