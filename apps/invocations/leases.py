"""Call leases: a running call belongs to the process running it for as long as that
process says so (issue 47).

A call that starts running (the REST, MCP or wire request's web process, or the worker
that claimed an approved call) is written with `lease_expires_at` = now + the lease
(TOOLHUB_CALL_LEASE_MS), in the statement that records its start. While its call runs,
the process renews the leases of all the calls it holds in ONE statement every fifth of
the lease (Keeper), whatever their number; a call that ends leaves the keeper. A process
that dies (kill -9, a lost machine) stops renewing, and its calls' leases run out.

A call whose lease ran out is settled (`settle`), with its tool_call_result, by the next
lease pass of a worker's sweeper (every TOOLHUB_LEASE_SWEEP_MS), or at once by a retry
with its idempotency key:

- it never reached its tool (`tool_pending`: it was waiting for a concurrency slot):
  failed `unavailable`, "never ran", retryAfterMs 0; a same-key retry runs it;
- else it may have had its effect: failed `execution`, and it is never run again by
  anyone but its caller (a same-key retry runs it, as after any failure: the ledger
  remembers successes only).

A same-key retry of a running call waits for it while its lease is renewed on time
(`fresh`); once a renewal is overdue (the owner is probably dead) it answers at once, 409
with a hint of the time left on the lease (`hint_ms`); after that the call is settled.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections
from django.utils import timezone

from apps.invocations.models import InvocationRecord, Status

logger = logging.getLogger(__name__)


def lease_s() -> float:
    return settings.TOOLHUB_CALL_LEASE_MS / 1000


def renew_s() -> float:
    """How often a process renews its calls' leases."""
    return lease_s() / 5


def overdue_s() -> float:
    """How long past its last renewal a lease is taken to be abandoned: two renewals."""
    return 2 * renew_s()


def expires(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + timedelta(seconds=lease_s())


NEVER_RAN = (
    "The process holding this call stopped before the tool ran: it never ran. "
    "Retry it (the same idempotencyKey runs it)."
)
MAY_HAVE_RUN = (
    "The process running this call stopped while the tool ran: it may have taken effect, "
    "so it was not run again."
)


class Keeper:
    """The calls this process runs; renews their leases in one UPDATE every renew_s(),
    from a daemon thread that runs only while there are some."""

    def __init__(self) -> None:
        self._held: set[Any] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._pause = 0.0  # how long the thread sleeps now

    def hold(self, pk: Any) -> None:
        with self._lock:
            self._held.add(pk)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="toolhub-lease-keeper", daemon=True
                )
                self._thread.start()
            elif self._pause > renew_s():  # the lease was shortened (settings changed)
                self._wake.set()

    def forget(self, pk: Any) -> None:
        with self._lock:
            self._held.discard(pk)

    def held(self) -> set[Any]:
        with self._lock:
            return set(self._held)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._pause = renew_s()
            self._wake.wait(self._pause)
            self._wake.clear()
            with self._lock:
                held = list(self._held)
                if not held:
                    self._thread = None
                    return
            try:
                renew(held)
            except OperationalError as error:  # no connection (pool exhausted, outage)
                # The next renewal tries again; the lease has room for it. An outage is
                # logged where requests meet it (toolhub.web.outage), not as a traceback.
                logger.warning("call leases not renewed: no database connection (%s)", error)
            except Exception:
                logger.exception("call leases not renewed")
            finally:
                connections.close_all()  # this thread's own: nothing stays checked out


def renew(held: list[Any]) -> int:
    """Every held call's lease runs lease_s() from now: one statement. Answers how many
    unfinished calls it renewed."""
    return InvocationRecord.objects.filter(pk__in=held, ended_at__isnull=True).update(
        lease_expires_at=expires()
    )


keeper = Keeper()


def running(record: InvocationRecord) -> bool:
    return record.ended_at is None and record.status == Status.RUNNING


def expired(record: InvocationRecord, now: datetime | None = None) -> bool:
    """A running call whose lease ran out (a call without one, started before leases, is
    left to the sweeper's timeout rule)."""
    at = record.lease_expires_at
    return running(record) and at is not None and at <= (now or timezone.now())


def fresh(record: InvocationRecord, now: datetime | None = None) -> bool:
    """Whether a running call's lease was renewed on time: its owner is alive. True for a
    call without a lease (nothing to tell)."""
    at = record.lease_expires_at
    if at is None or not running(record):
        return True
    renewed = at - timedelta(seconds=lease_s())
    return (now or timezone.now()) - renewed <= timedelta(seconds=overdue_s())


def hint_ms(record: InvocationRecord, now: datetime | None = None) -> int:
    """Milliseconds until the call's lease runs out (at least 1): when a retry learns its
    outcome, or runs it."""
    at = record.lease_expires_at
    if at is None:
        return 1000
    left = (at - (now or timezone.now())).total_seconds() * 1000
    return max(1, math.ceil(left))
