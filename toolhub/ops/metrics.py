"""GET /metrics: Prometheus text format, for scrapers.

Calls and latencies are counted as calls end, by the database in the statement that
ends a record, and folded into rollups by the sweeper (apps/invocations/rollups.py): a
scrape reads O(tenants x tools x statuses) rows, not the records, and any process answers
with the totals of all processes; a restart resets nothing. Calls in flight, pending
approvals and queue depth are read at scrape time from partial indexes that hold only
such rows. Over-capacity drops of the Redis channel layer
(`toolhub_channel_layer_dropped_total`) are counted in Redis by every process. Open
streams (`toolhub_open_streams`) and result cache lookups
(`toolhub_result_cache_lookups_total`) are per-process numbers: each process counts its
own, so a dashboard sums them over instances.

Access: `Authorization: Bearer $TOOLHUB_METRICS_TOKEN`, or a superuser's session (for a
look in the browser). The numbers name every tenant and tool, so nobody else gets them:
no token and no session is a 401, a wrong token too (compared in constant time).
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from apps.invocations import concurrency, result_cache, stats
from toolhub.layers.redis_layer import GROUP_KINDS, dropped_counts
from toolhub.ops import exposition

logger = logging.getLogger(__name__)


class OpenStreams:
    """WebSocket streams open in this process, by kind ("runs", "approvals")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def opened(self, kind: str) -> None:
        with self._lock:
            self._open[kind] = self._open.get(kind, 0) + 1

    def closed(self, kind: str) -> None:
        with self._lock:
            self._open[kind] = max(0, self._open.get(kind, 0) - 1)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._open)


open_streams = OpenStreams()
STREAM_KINDS = ("runs", "approvals")


class CountedStream:
    """Mixin for a WebSocket consumer: counts it in `open_streams` from accept until the
    server closes it or the client goes, whichever comes first.

    A refused stream is accepted and closed at once (`streams.refuse`, so the client can
    read the close code): it is counted for that instant only.
    """

    stream_kind = ""
    _counted = False

    async def accept(self, subprotocol: Any = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)  # type: ignore[misc]
        open_streams.opened(self.stream_kind)
        self._counted = True

    async def close(self, code: Any = None, reason: Any = None) -> None:
        self._uncount()
        await super().close(code, reason)  # type: ignore[misc]

    async def websocket_disconnect(self, message: Any) -> None:
        self._uncount()
        await super().websocket_disconnect(message)  # type: ignore[misc]

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            open_streams.closed(self.stream_kind)


class DatabaseCollector(Collector):
    """Builds every metric from the rollups and a few small grouped queries when scraped."""

    def collect(self) -> Iterator[Any]:
        totals = stats.call_totals()
        calls = CounterMetricFamily(
            "toolhub_tool_calls",
            "Tool calls that ended, by tenant, tool and final status (refused calls included).",
            labels=["tenant", "tool", "status"],
        )
        for row in stats.calls_by_tool_and_outcome(totals):
            calls.add_metric([row["tenant__slug"], row["tool_ref"], row["status"]], row["n"])
        yield calls

        in_flight = GaugeMetricFamily(
            "toolhub_tool_calls_in_flight",
            "Tool calls not ended yet, by tenant, tool and status (held, queued, running).",
            labels=["tenant", "tool", "status"],
        )
        for row in stats.calls_in_flight():
            in_flight.add_metric([row["tenant__slug"], row["tool_ref"], row["status"]], row["n"])
        yield in_flight

        latency = HistogramMetricFamily(
            "toolhub_tool_call_duration_seconds",
            "Duration of tool calls that ended, by tenant and tool.",
            labels=["tenant", "tool"],
        )
        for row in stats.latency_histograms(totals):
            buckets = [(_bound(bound), count) for bound, count in row["buckets"]]
            buckets.append(("+Inf", row["count"]))
            latency.add_metric([row["tenant"], row["tool"]], buckets, row["sum_seconds"])
        yield latency

        pending = GaugeMetricFamily(
            "toolhub_pending_approvals", "Calls waiting for a human decision.", labels=["tenant"]
        )
        for tenant, count in stats.pending_by_tenant().items():
            pending.add_metric([tenant], count)
        yield pending

        queue = GaugeMetricFamily(
            "toolhub_queue_depth",
            "Tasks (approved calls, notifications) waiting for a worker.",
            labels=["queue"],
        )
        depth = stats.queue_depth()
        for name in sorted({"default", *depth}):
            queue.add_metric([name], depth.get(name, 0))
        yield queue

        cache = CounterMetricFamily(
            "toolhub_result_cache_lookups",
            "Result cache lookups of read-only tools in this process (sum over processes), "
            "by tenant, tool and outcome (hit, miss).",
            labels=["tenant", "tool", "outcome"],
        )
        for (tenant, tool, outcome), count in sorted(result_cache.lookups.snapshot().items()):
            cache.add_metric([tenant, tool, outcome], count)
        yield cache

        slots = GaugeMetricFamily(
            "toolhub_concurrency_slots_in_use",
            "Calls holding a concurrency slot (a tool's or tenant's limit), every process's.",
            labels=["tenant", "tool"],
        )
        for row in concurrency.in_use():
            slots.add_metric([row["tenant__slug"], row["tool_id"]], row["n"])
        yield slots

        waits = CounterMetricFamily(
            "toolhub_concurrency_calls",
            "Calls over a concurrency limit in this process (sum over processes): `waited` "
            "then ran, `refused` (rate_limited, or unavailable for lingering threads).",
            labels=["outcome", "tenant", "tool"],
        )
        for (outcome, tenant, tool), n in sorted(concurrency.counts.snapshot().items()):
            waits.add_metric([outcome, tenant, tool], n)
        yield waits

        lingering = GaugeMetricFamily(
            "toolhub_tool_threads_lingering",
            "Tool threads of this process still running after their call ended (timeout, "
            "cancelled), by tool.",
            labels=["tool"],
        )
        for tool, n in sorted(concurrency.lingering.snapshot().items()):
            lingering.add_metric([tool], n)
        yield lingering

        dropped = _dropped_by_the_layer()
        if dropped is not None:
            layer_drops = CounterMetricFamily(
                "toolhub_channel_layer_dropped",
                "Messages the Redis channel layer dropped because a receiving channel was "
                "full (every process's, since Redis started), by group kind: run (run "
                "streams), tenant (approval streams), other, direct (a send to one channel).",
                labels=["group"],
            )
            for kind in sorted({*GROUP_KINDS, "other", "direct", *dropped}):
                layer_drops.add_metric([kind], dropped.get(kind, 0))
            yield layer_drops

        streams = GaugeMetricFamily(
            "toolhub_open_streams",
            "WebSocket streams open in this process (sum over processes).",
            labels=["kind"],
        )
        current = open_streams.snapshot()
        for kind in STREAM_KINDS:
            streams.add_metric([kind], current.get(kind, 0))
        yield streams


def _dropped_by_the_layer() -> dict[str, int] | None:
    """The Redis layer's drop counts (scale-out), or None without Redis or when it does not
    answer (the scrape goes on without them)."""
    if not settings.REDIS_URL:
        return None
    config: Any = settings.CHANNEL_LAYERS["default"].get("CONFIG", {})
    prefix = str(config.get("prefix", "asgi"))
    try:
        return dropped_counts(settings.REDIS_URL, prefix)
    except Exception as error:
        logger.warning("metrics: could not read the channel layer's drops (%s)", error)
        return None


def _bound(seconds: float) -> str:
    return repr(float(seconds))


registry = CollectorRegistry(auto_describe=False)
registry.register(DatabaseCollector())


def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        # Anyone may ask: the answer says how to get in, never which setting holds the token.
        response = HttpResponse(
            "Metrics need a scrape token (Authorization: Bearer <token>) or a superuser session.\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # The classic text format (0.0.4): what every Prometheus version and agent scrapes.
    return HttpResponse(exposition.text(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)


def _allowed(request: HttpRequest) -> bool:
    token = settings.TOOLHUB_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_superuser)
