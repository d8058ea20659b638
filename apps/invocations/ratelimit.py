"""The calls-per-minute budget, atomic and shared by every process through the database.

A sliding log, not fixed windows: a principal may have at most `limit` calls admitted in
any 60 seconds, so no burst of 2 x limit across a window edge, and the moment the next
call may pass is exact: when the oldest admission that keeps the log full turns 60 s old.

Counting and admitting happen under one lock per (tenant, principal), the `CallWindow`
row: `SELECT ... FOR UPDATE` on PostgreSQL; on SQLite every transaction begins
IMMEDIATE (settings.py), which takes the database's write lock, so admissions
serialise there too. Concurrent calls in any number of processes therefore cannot
both take the last slot.

Cleanup: each admission deletes its own principal's expired entries (so a window never
holds more than `limit` of them), and removes up to `PURGE_BATCH` windows idle for a
whole minute (all their entries expired), skipping any another process holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.invocations.models import AdmittedCall, CallWindow
from apps.tenants.models import Tenant

WINDOW = timedelta(seconds=60)
PURGE_BATCH = 100


@dataclass(frozen=True)
class Admission:
    admitted: bool
    retry_after_ms: int = 0  # when refused: milliseconds until a call would be admitted


def admit(tenant: Tenant, principal: str, limit: int) -> Admission:
    """Take one of the principal's `limit` slots per minute, or say when one frees."""
    while True:
        window, _ = CallWindow.objects.get_or_create(tenant=tenant, principal=principal)
        with transaction.atomic():
            locked = CallWindow.objects.select_for_update().filter(pk=window.pk).first()
            if locked is None:
                continue  # purged as idle between get_or_create and the lock: start again
            now = timezone.now()  # read under the lock: waiting for it takes time
            admission = _admit_locked(locked, limit, now)
            _forget_idle_windows(now, keep=locked.pk)
            return admission


def peek(tenant: Tenant, principal: str, limit: int) -> Admission:
    """Whether a call would be admitted now, taking no slot and writing nothing
    (the dry run asks this; two dry runs never use up a principal's budget)."""
    now = timezone.now()
    live = AdmittedCall.objects.filter(
        window__tenant=tenant, window__principal=principal, at__gt=now - WINDOW
    )
    count = live.count()
    if count < limit:
        return Admission(admitted=True)
    freeing = live.order_by("at").values_list("at", flat=True)[count - limit]
    return Admission(admitted=False, retry_after_ms=_ms_until(freeing + WINDOW, now))


def _admit_locked(window: CallWindow, limit: int, now: datetime) -> Admission:
    entries = AdmittedCall.objects.filter(window=window)
    entries.filter(at__lte=now - WINDOW).delete()
    count = entries.count()
    if count < limit:
        AdmittedCall.objects.create(window=window, at=now)
        CallWindow.objects.filter(pk=window.pk).update(last_admitted_at=now)
        return Admission(admitted=True)
    # Full: one more call fits once count - limit + 1 entries have expired, i.e. when
    # the (count - limit)-th oldest (0-based) turns a window old. count > limit only
    # after the limit was lowered.
    freeing = entries.order_by("at").values_list("at", flat=True)[count - limit]
    return Admission(admitted=False, retry_after_ms=_ms_until(freeing + WINDOW, now))


def _ms_until(moment: datetime, now: datetime) -> int:
    """Whole milliseconds, rounded up and at least 1: retrying earlier would be refused."""
    return max(1, math.ceil((moment - now).total_seconds() * 1000))


def _forget_idle_windows(now: datetime, keep: int) -> None:
    """Delete windows whose last admission is a window old; their entries go with them.

    SKIP LOCKED (PostgreSQL) leaves windows another admission holds, so purges never
    wait on one another; on SQLite the write lock already makes this exclusive.
    """
    idle = list(
        CallWindow.objects.select_for_update(skip_locked=True)
        .filter(last_admitted_at__lte=now - WINDOW)
        .exclude(pk=keep)
        .values_list("pk", flat=True)[:PURGE_BATCH]
    )
    if idle:
        CallWindow.objects.filter(pk__in=idle).delete()
