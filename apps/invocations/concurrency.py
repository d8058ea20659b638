"""Concurrency limits: how many calls of one tool (all tenants together), and of one
tenant (all tools together), run at once in every process of a deployment.

A running call under a limit holds a slot, a `ConcurrencySlot` row. Counting and taking
happen under a lock: the tool's row and the tenant's row, `SELECT ... FOR NO KEY UPDATE`
on PostgreSQL (records that reference them still insert meanwhile: their FOR KEY SHARE
does not conflict); on SQLite every transaction begins IMMEDIATE (settings.py), which
serialises them. Concurrent calls in any number of processes cannot both take the last
slot. A call without a limit reads and writes nothing here.

A slot is a lease: it expires `LEASE_S` after its call's deadline unless renewed, and
this process renews the slots it holds every `RENEW_S` while their threads run (Keeper).
A process that dies stops renewing: its slots expire and the next acquisition for the
tool or tenant deletes them. A slot is given back when the tool's thread really ends,
not when the call does: a call that timed out or was cancelled keeps counting while its
code still runs (Python cannot stop a thread).

Lingering threads (such calls' threads) are also capped per process, whatever the limits
(Lingering): a tool that hangs cannot take every tool thread.

A call over a limit waits up to TOOLHUB_CONCURRENCY_WAIT_S, woken at once when a slot
of this process is given back and polling for other processes', then is refused with a
retry hint: the time until the earliest blocking call's deadline.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Count
from django.utils import timezone

from apps.invocations.models import ConcurrencySlot
from apps.tenants.models import Tenant
from apps.tools.models import Tool

logger = logging.getLogger(__name__)

LEASE_S = 60.0  # past a call's deadline, unless renewed: how long a dead process's slots last
RENEW_S = 15.0  # how often this process renews the slots its running threads hold
POLL_S = (0.02, 0.25)  # first and longest pause between two tries while waiting
UNKNOWN_END_MS = 1000  # the hint when only calls past their deadline hold the slots


class Full(Exception):
    """No slot freed within the wait."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class WaitCancelled(Exception):
    """The call was cancelled while it waited for a slot."""


def limits(tool: Tool, tenant: Tenant) -> tuple[int | None, int | None]:
    """The tool's and the tenant's limits (None: none)."""
    return tool.max_concurrency, tenant.max_concurrent_calls


class Slot:
    """One slot this process holds; `release` gives it back once, whoever calls it."""

    def __init__(self, pk: int, tenant_slug: str, tool_id: str) -> None:
        self.pk = pk
        self.tenant_slug = tenant_slug
        self.tool_id = tool_id
        self.handed = False  # the tool's thread releases it when it ends
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        keeper.forget(self.pk)
        try:
            ConcurrencySlot.objects.filter(pk=self.pk).delete()
        except Exception:  # its lease expires: the slot frees itself, later
            logger.exception("concurrency slot %s not given back", self.pk)
        with _freed:
            _freed.notify_all()

    def release_when_done(self, future: Future[Any]) -> None:
        """Handed to the tool's thread: released when it ends (its own `finally`), or here
        if the future was cancelled before a thread took it."""
        self.handed = True
        future.add_done_callback(self._release_if_never_started)

    def _release_if_never_started(self, future: Future[Any]) -> None:
        if future.cancelled():
            self.release()


_freed = threading.Condition()  # notified when this process gives a slot back


def acquire(
    tool: Tool,
    tenant: Tenant,
    deadline_s: float,
    cancelled: Callable[[], bool] = lambda: False,
) -> Slot | None:
    """A slot for one call of `tool` by `tenant` (None: neither has a limit).

    Waits up to TOOLHUB_CONCURRENCY_WAIT_S for one to free; raises Full then, or
    WaitCancelled if `cancelled()` says so between two tries. `deadline_s`: how long
    the call may run once it has the slot (its timeout), for others' retry hints.
    """
    tool_limit, tenant_limit = limits(tool, tenant)
    if tool_limit is None and tenant_limit is None:
        return None
    wait_s = float(settings.TOOLHUB_CONCURRENCY_WAIT_S)
    give_up = time.monotonic() + wait_s
    pause, longest = POLL_S
    waited = False
    while True:
        taken = _take(tool, tenant, tool_limit, tenant_limit, deadline_s)
        if isinstance(taken, Slot):
            if waited:
                counts.note("waited", tenant.slug, tool.pk)
            return taken
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            counts.note("refused", tenant.slug, tool.pk)
            raise Full(_full_message(taken, tool, tenant, wait_s), taken.retry_after_ms)
        waited = True
        with _freed:
            _freed.wait(min(pause, remaining))
        pause = min(pause * 2, longest)
        if cancelled():
            raise WaitCancelled


@dataclass(frozen=True)
class _Blocked:
    tool_full: bool
    tenant_full: bool
    retry_after_ms: int


def _take(
    tool: Tool, tenant: Tenant, tool_limit: int | None, tenant_limit: int | None, run_s: float
) -> Slot | _Blocked:
    with transaction.atomic():
        # Lock order: tool, then tenant, in every process (no deadlock between them).
        if tool_limit is not None:
            list(Tool.objects.select_for_update(no_key=True).filter(pk=tool.pk).values("pk"))
        if tenant_limit is not None:
            list(Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values("pk"))
        now = timezone.now()  # read under the lock: waiting for it takes time
        expired = ConcurrencySlot.objects.filter(expires_at__lte=now)
        live = ConcurrencySlot.objects.filter(expires_at__gt=now)
        blocking = []
        tool_full = tenant_full = False
        if tool_limit is not None:
            expired.filter(tool_id=tool.pk).delete()
            held = live.filter(tool_id=tool.pk)
            tool_full = held.count() >= tool_limit
            if tool_full:
                blocking.append(held)
        if tenant_limit is not None:
            expired.filter(tenant=tenant).delete()
            held = live.filter(tenant=tenant)
            tenant_full = held.count() >= tenant_limit
            if tenant_full:
                blocking.append(held)
        if blocking:
            return _Blocked(tool_full, tenant_full, _hint(blocking, now))
        ends_by = now + timedelta(seconds=run_s)
        row = ConcurrencySlot.objects.create(
            tenant=tenant,
            tool_id=tool.pk,
            acquired_at=now,
            ends_by=ends_by,
            expires_at=ends_by + timedelta(seconds=LEASE_S),
        )
    slot = Slot(row.pk, tenant.slug, tool.pk)
    keeper.hold(row.pk)
    return slot


def _hint(blocking: list[Any], now: datetime) -> int:
    """Milliseconds until a blocking call's deadline: the earliest a slot frees when its
    calls end in time. Each full limit must free one, so the latest of their earliest."""
    moments = []
    for held in blocking:
        earliest = held.order_by("ends_by").values_list("ends_by", flat=True).first()
        if earliest is not None:
            moments.append(earliest)
    if not moments:
        return UNKNOWN_END_MS
    ms = math.ceil((max(moments) - now).total_seconds() * 1000)
    return ms if ms > 0 else UNKNOWN_END_MS  # only calls past their deadline hold them


def _full_message(blocked: _Blocked, tool: Tool, tenant: Tenant, wait_s: float) -> str:
    full = []
    if blocked.tool_full:
        full.append(f"{tool.pk} runs at most {tool.max_concurrency} call(s) at once")
    if blocked.tenant_full:
        full.append(f"this tenant runs at most {tenant.max_concurrent_calls} call(s) at once")
    return (
        f"Concurrency limit reached: {' and '.join(full)}; no slot freed in {wait_s:g} s. "
        f"Retry in {blocked.retry_after_ms / 1000:.1f} s."
    )


class Keeper:
    """Renews the leases of the slots this process holds, every RENEW_S, from a daemon
    thread that runs only while there are some."""

    def __init__(self) -> None:
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, pk: int) -> None:
        with self._lock:
            self._held.add(pk)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="toolhub-slot-keeper", daemon=True
                )
                self._thread.start()

    def forget(self, pk: int) -> None:
        with self._lock:
            self._held.discard(pk)

    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)

    def _run(self) -> None:
        while True:
            time.sleep(RENEW_S)
            with self._lock:
                held = list(self._held)
                if not held:
                    self._thread = None
                    return
            self.renew(held)

    @staticmethod
    def renew(held: list[int]) -> None:
        """Each slot's lease runs LEASE_S from now: its thread still runs."""
        try:
            expires = timezone.now() + timedelta(seconds=LEASE_S)
            ConcurrencySlot.objects.filter(pk__in=held, expires_at__lt=expires).update(
                expires_at=expires
            )
        except Exception:
            logger.exception("concurrency slots not renewed")
        finally:
            connections.close_all()  # this thread's own: nothing stays checked out


keeper = Keeper()


class Lingering:
    """Tool threads of this process whose call already ended (timeout, cancelled) while
    their code still runs, by tool. Each keeps a thread of the pool busy: past
    TOOLHUB_TOOL_LINGERING_PER_TOOL for one tool, or TOOLHUB_TOOL_LINGERING_MAX in all
    while the tool has any, that tool's new calls are refused rather than queued behind
    them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tool: Counter[str] = Counter()

    def outlived(self, tool_id: str, future: Future[Any]) -> None:
        """The call of this still-running future ended without it."""
        with self._lock:
            self._by_tool[tool_id] += 1
        future.add_done_callback(lambda done: self._ended(tool_id))

    def _ended(self, tool_id: str) -> None:
        with self._lock:
            self._by_tool[tool_id] -= 1
            if self._by_tool[tool_id] <= 0:
                del self._by_tool[tool_id]

    def of(self, tool_id: str) -> int:
        with self._lock:
            return self._by_tool.get(tool_id, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_tool)

    def too_many(self, tool_id: str) -> int | None:
        """The tool's lingering threads if it may not start another call now, else None."""
        with self._lock:
            mine = self._by_tool.get(tool_id, 0)
            total = sum(self._by_tool.values())
        if mine >= settings.TOOLHUB_TOOL_LINGERING_PER_TOOL or (
            mine and total >= settings.TOOLHUB_TOOL_LINGERING_MAX
        ):
            return mine
        return None


lingering = Lingering()


class Counts:
    """Calls that waited for a slot and calls refused for want of one, in this process
    (/metrics: a dashboard sums them over instances)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def note(self, what: str, tenant: str, tool_id: str) -> None:
        with self._lock:
            self._counts[(what, tenant, tool_id)] += 1

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._counts)


counts = Counts()


def in_use() -> list[dict[str, Any]]:
    """Live slots by tenant and tool, every process's (/metrics)."""
    rows = (
        ConcurrencySlot.objects.filter(expires_at__gt=timezone.now())
        .values("tenant__slug", "tool_id")
        .annotate(n=Count("id"))
        .order_by("tenant__slug", "tool_id")
    )
    return [dict(row) for row in rows]
