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
  failed `unavailable`, "never ran", retryAfterMs 0; a same-key retry runs it. A
  worker's approved call is put back in the queue instead, a bounded number of times
  (apps.approvals.tasks.reoffer): the next worker runs it, once;
- else it may have had its effect: failed `execution`, and it is never run again by
  anyone but its caller (a same-key retry runs it, as after any failure: the ledger
  remembers successes only).

Whose lease it is: the record names its owner (`lease_owner`, Life.token). On
PostgreSQL every process that runs calls holds, for its whole life, a session advisory
lock of its own on a connection of its own (Life); PostgreSQL frees it the moment the
process dies (kill -9 closes its socket). A same-key retry, or the sweeper, that can take
that lock knows the owner is dead and settles the call at once (`owner_dead`), without
waiting for its lease to run out. On SQLite (one host) the owner is dead when its process
id no longer runs the process that wrote it (/proc). When it cannot be told (another host
without the lock), the lease decides as before.

A same-key retry of a running call waits for it while its owner is alive and renews its
lease on time (`fresh`); a dead owner's call is settled there and answered at once (the
settled record: its state and retry hint); an owner alive but late with its renewals (a
paused process) is answered at once, 409 with a hint of the time left on the lease
(`hint_ms`); after that the call is settled.

A process paused past its lease (SIGSTOP, a frozen VM) finds its call settled when it
resumes: the end it writes then applies only to a record still `running` (`guard`), so
it never overwrites the settled one; what it knew is logged (`late_end`). A call settled
as never run (`tool_pending`) is not handed to its tool afterwards either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import socket
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connections
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
                life.keep()
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


def _started(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc), "" if unknown: with
    the pid it names one process, whatever reuses the pid later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return fields[19].decode() if len(fields) > 19 else ""


class Life:
    """This process's identity as a lease owner, and on PostgreSQL the advisory lock it
    holds for its life on a connection of its own (not the pool's: a pooled connection
    is given back). `token()` is what a record's `lease_owner` says: the lock's key (0
    without one), the process id, its start and the host."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._key = 0
        self._held: Any = None  # the psycopg connection holding the lock
        self._token = ""

    def _mine(self) -> None:
        if self._pid != os.getpid():  # first use, or a forked child: an identity of its own
            self._pid, self._key, self._held, self._token = os.getpid(), 0, None, ""

    def token(self, using: str = "default") -> str:
        with self._lock:
            self._mine()
            if connections[using].vendor == "postgresql" and self._held is None:
                self._take(using)
            if not self._token:
                self._token = f"{self._key}/{self._pid}/{_started(self._pid)}@{HOST}"
            return self._token

    def mine(self, token: str) -> bool:
        with self._lock:
            return token == self._token and self._pid == os.getpid()

    def keep(self) -> None:
        """Called with each renewal: a lock whose connection broke is taken again (a
        retry meanwhile takes its owner for dead: the guards below keep that safe)."""
        with self._lock:
            self._mine()
            if self._held is None:
                return
            try:
                with self._held.cursor() as cursor:
                    cursor.execute("SELECT 1")
            except Exception as error:
                logger.warning("call leases: the liveness lock's connection broke (%s)", error)
                self._close()
                self._take("default")

    def _take(self, using: str) -> None:
        import psycopg

        params = connections[using].get_connection_params()
        key = self._key or secrets.randbits(62) + 1
        try:
            held = psycopg.connect(**params, autocommit=True)
            with held.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.Error as error:  # the call runs without: its lease alone decides
            logger.warning("call leases: no liveness lock (%s)", error)
            return
        self._held, self._key, self._token = held, key, ""

    def close(self) -> None:
        """Let go of the lock (a test database about to be dropped): its calls' owner now
        looks dead."""
        with self._lock:
            if self._held is not None:
                self._close()
            self._token = ""

    def _close(self) -> None:
        with contextlib.suppress(Exception):  # broken already
            self._held.close()
        self._held = None


HOST = socket.gethostname()[:60]


life = Life()


def owner() -> str:
    """The `lease_owner` of a call this process starts now."""
    return life.token()


def owner_dead(record: InvocationRecord) -> bool:
    """Whether the process holding this running call's lease is known to be dead: its
    liveness lock can be taken (PostgreSQL), or, on this host without one, its process is
    gone. False when alive or when it cannot be told."""
    token = record.lease_owner
    if not token or not running(record):
        return False
    try:
        ident, host = token.rsplit("@", 1)
        key_text, pid_text, started = ident.split("/", 2)
        key, pid = int(key_text), int(pid_text)
    except ValueError:
        return False
    if life.mine(token):
        return False  # this process
    connection = connections[record._state.db or "default"]
    if key and connection.vendor == "postgresql":
        try:  # taken only for this statement's transaction (or the caller's): nobody waits
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [key])
                row = cursor.fetchone()
        except DatabaseError:
            return False
        return bool(row and row[0])
    if host != HOST or not started:
        return False
    return _started(pid) != started


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


_GUARD = "_lease_end_guarded"


def guard(record: InvocationRecord) -> None:
    """This record's end (being built now from a running, leased call) is written only
    while the record is still `running`: it may have been settled meanwhile."""
    record.__dict__[_GUARD] = True


def guarded(record: Any) -> bool:
    return bool(record.__dict__.get(_GUARD))


def late_end(record: InvocationRecord) -> None:
    """An end that came after its call was settled (its process paused past its lease):
    not written. What it knew is logged (values only as TOOLHUB_LOG_ARGUMENT_VALUES
    allows, else their shape); the record is read again: the settled one is the answer."""
    from apps.tools.redaction import shape_of

    result = record.result if settings.TOOLHUB_LOG_ARGUMENT_VALUES else shape_of(record.result)
    knew = (record.status, record.error_code or "-", record.duration_ms, record.safe_message)
    record.__dict__.pop(_GUARD, None)
    record.refresh_from_db()
    logger.warning(
        "late end of call %s (%s) not written: it was settled (%s, %s) before it ended; it "
        "ended status=%s error=%s duration_ms=%s message=%r result=%s",
        record.pk,
        record.tool_ref,
        record.status,
        record.error_code,
        *knew,
        json.dumps(result, separators=(",", ":"), default=str),
    )
