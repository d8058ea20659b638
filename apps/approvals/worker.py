"""Task workers: separate processes (`manage.py toolhub_worker`) or, for the
embedded demo, threads inside the web process (TOOLHUB_EMBEDDED_WORKER=1).

A worker never gives up: a database that is down, restarting or refusing
connections is logged in one line and retried with backoff, at start as much as
mid-batch. It is woken by the commit of new work (apps.approvals.wake) and polls
as the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading

from django.db import close_old_connections, connection
from django.db.utils import OperationalError
from django.tasks import TaskResultStatus
from django.utils import timezone
from django_tasks_db.management.commands.db_worker import Worker
from django_tasks_db.models import DBTaskResult, get_date_max
from django_tasks_db.utils import exclusive_transaction, is_locked_database_exception

from apps.approvals import tasks, wake
from apps.invocations import events

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0
# Polling is only the safety net behind the commit wake-up.
POLL_EVERY_S = 2.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class Backoff:
    """Doubling delays after consecutive failures; one log line when they start and end."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.delay = 0.0
        self.failures = 0

    def failed(self, error: BaseException) -> float:
        self.failures += 1
        self.delay = min(BACKOFF_MAX_S, (self.delay * 2) or BACKOFF_FIRST_S)
        logger.warning(
            "%s failed (%s); retry %d in %.1f s",
            self.what,
            wake._one_line(error),
            self.failures,
            self.delay,
        )
        return self.delay

    def succeeded(self) -> None:
        if self.failures:
            logger.warning("%s works again after %d failed attempts", self.what, self.failures)
        self.delay, self.failures = 0.0, 0


class ToolhubWorker(Worker):
    """django-tasks-db's worker, made to survive its database and to wake on commit."""

    def __init__(self, *args: object, listen: bool = True, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.listen = listen
        self.backoff = Backoff(f"task worker {self.worker_id}")
        # A queue entry whose outcome could not be written (the database went away
        # while its task ran): written once the database is back.
        self.unsettled: DBTaskResult | None = None

    def run(self) -> None:
        logger.info("Starting worker worker_id=%s", self.worker_id)
        listener = wake.Listener() if self.listen and connection.vendor == "postgresql" else None
        if listener is not None:
            listener.start()
        try:
            while self.running:
                try:
                    ran = self.run_next()
                except Exception as error:
                    _drop_connection()
                    wake.wait(self.backoff.failed(error))
                    continue
                self.backoff.succeeded()
                if ran is None and self.batch:
                    logger.info("No more tasks to run for worker_id=%s", self.worker_id)
                    return
                if ran is None and self.running:
                    wake.wait(self.interval)
        finally:
            if listener is not None:
                listener.stopped.set()

    def run_next(self) -> DBTaskResult | None:
        """Claim and run one ready entry; None when there is none.

        The worker keeps its database connection from one entry to the next (a new one
        per entry cost milliseconds of every decision's latency); one that failed is
        dropped by `run` and opened again on the next attempt."""
        self.settle_unsettled()
        try:
            entry = self.claim()
        except OperationalError as error:
            if is_locked_database_exception(error):  # SQLite busy: try again soon
                return None
            raise
        if entry is None:
            return None
        self.unsettled = entry
        self.run_task(entry)  # writes the outcome; raises if the database is gone
        self.unsettled = None
        return entry

    def claim(self) -> DBTaskResult | None:
        """The next ready entry, marked RUNNING for this worker. On PostgreSQL one
        statement (UPDATE .. FOR UPDATE SKIP LOCKED .. RETURNING): one round trip
        instead of BEGIN, SELECT, UPDATE, COMMIT; concurrent workers skip each other's."""
        if connection.vendor != "postgresql":
            ready = DBTaskResult.objects.ready().filter(
                backend_name=self.backend_name, queue_name__in=self.queue_names
            )
            with exclusive_transaction(ready.db):
                entry = ready.get_locked()
                if entry is not None:
                    entry.claim(self.worker_id)
            return entry
        now = timezone.now()
        claimed = DBTaskResult.objects.raw(
            _CLAIM_SQL,
            [
                TaskResultStatus.RUNNING,
                now,
                self.worker_id,
                TaskResultStatus.READY,
                self.backend_name,
                list(self.queue_names),
                get_date_max(),
                now,
            ],
        )
        return next(iter(claimed), None)

    def settle_unsettled(self) -> None:
        entry, self.unsettled = self.unsettled, None
        if entry is None:
            return
        DBTaskResult.objects.filter(pk=entry.pk, status="RUNNING").update(
            status="FAILED",
            finished_at=timezone.now(),
            exception_class_path="django.db.utils.OperationalError",
            traceback="The database went away before this task's outcome was written.",
        )


_TABLE = DBTaskResult._meta.db_table
# django-tasks-db's ready() and ordering (its partial index serves the inner SELECT),
# claimed as DBTaskResult.claim does it.
_CLAIM_SQL = f"""
UPDATE {_TABLE}
SET status = %s, started_at = %s, worker_ids = worker_ids || jsonb_build_array(%s::text)
WHERE id = (
    SELECT id FROM {_TABLE}
    WHERE status = %s AND backend_name = %s AND queue_name = ANY(%s)
      AND (run_after = %s OR run_after <= %s)
    ORDER BY priority DESC, run_after ASC, enqueued_at ASC
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING *
"""  # noqa: S608  (a table name from the model, values as parameters)


def _drop_connection() -> None:
    """A broken connection is thrown away so the next attempt opens a new one."""
    with contextlib.suppress(Exception):
        connection.close()


def build_worker(
    worker_id: str | None = None,
    *,
    interval: float = POLL_EVERY_S,
    batch: bool = False,
    listen: bool = True,
) -> ToolhubWorker:
    return ToolhubWorker(
        queue_names=["default"],
        interval=interval,
        batch=batch,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id=worker_id or f"{socket.gethostname()}-{os.getpid()}"[:64],
        excluded_queue_names=[],
        listen=listen,
    )


class Sweeper(threading.Thread):
    """Expires overdue approvals, re-enqueues lost ones, settles the work of dead
    workers and repairs missing result events, every few seconds."""

    def __init__(self, every: float = SWEEP_EVERY_S) -> None:
        super().__init__(name="toolhub-sweeper", daemon=True)
        self.every = every
        self.stopped = threading.Event()
        self.backoff = Backoff("approval sweep")

    def run(self) -> None:
        while not self.stopped.wait(self.backoff.delay or self.every):
            try:
                close_old_connections()
                tasks.sweep()
                self.backoff.succeeded()
            except Exception as error:
                self.backoff.failed(error)
                _drop_connection()
            finally:
                with contextlib.suppress(Exception):
                    close_old_connections()


def start_push_loop() -> None:
    """Run events are pushed to the channel layer from one event loop that lives as long
    as this worker process: async_to_sync made a new loop, and with it a new Redis
    connection, for every push (two per call). Not for the embedded worker: its pushes
    belong to the web server's loop."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def remember() -> None:
        events.remember_server_loop()
        ready.set()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(remember)
        loop.run_forever()

    threading.Thread(target=serve, name="toolhub-push-loop", daemon=True).start()
    ready.wait(timeout=10)


def start_embedded() -> None:
    """One worker thread and one sweeper thread in this process (the embedded demo)."""
    worker = build_worker(f"embedded-{os.getpid()}")
    threading.Thread(target=worker.run, name="toolhub-worker", daemon=True).start()
    Sweeper().start()
    logger.info("embedded task worker started")
