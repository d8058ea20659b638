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
import time
from datetime import datetime

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Min
from django.db.utils import OperationalError
from django.tasks import TaskResultStatus
from django.utils import timezone
from django_tasks_db.management.commands.db_worker import Worker
from django_tasks_db.models import DBTaskResult, get_date_max
from django_tasks_db.utils import exclusive_transaction, is_locked_database_exception

from apps.approvals import tasks, wake
from apps.invocations import events, runner
from apps.retention import schedule as retention

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0
# Polling is only the safety net behind the commit wake-up: every POLL_EVERY_S while
# no listener listens (SQLite, or PostgreSQL while the listener reconnects), every
# LISTENING_POLL_S while one does, and never later than the next delayed entry's
# run_after (a webhook's retry). An idle worker polling every 2 s cost a fifth of an
# idle process's CPU.
POLL_EVERY_S = 2.0
LISTENING_POLL_S = 30.0
# Entries one worker claims in one statement (issue 13: per-call round trips). Small:
# a slow tool holds the rest of its batch, which another worker could be running.
CLAIM_BATCH = 16
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

    def __init__(
        self, *args: object, listen: bool = True, claim_batch: int = 1, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.listen = listen
        self.backoff = Backoff(f"task worker {self.worker_id}")
        self.claim_batch = claim_batch
        # Queue entries whose outcome could not be written (the database went away
        # while their tasks ran): written once the database is back.
        self.unsettled: list[DBTaskResult] = []

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
                    wake.wait(self.idle_wait(listener))
        finally:
            if listener is not None:
                listener.stop()

    def idle_wait(self, listener: wake.Listener | None) -> float:
        """How long an idle worker sleeps unless woken: its interval, or while its
        listener listens, LISTENING_POLL_S or until the next delayed entry is due."""
        if listener is None or not listener.listening.is_set():
            return self.interval
        wait = max(self.interval, LISTENING_POLL_S)
        try:
            due = self.next_delayed()
        except Exception:  # the database went away: the next claim meets it and backs off
            _drop_connection()
            return self.interval
        if due is not None:
            wait = min(wait, max(0.0, (due - timezone.now()).total_seconds()))
        return wait

    def next_delayed(self) -> datetime | None:
        """The earliest run_after of this worker's ready entries that are not due yet
        (django-tasks-db's partial index on ready entries serves it)."""
        return (
            DBTaskResult.objects.filter(
                status=TaskResultStatus.READY,
                backend_name=self.backend_name,
                queue_name__in=self.queue_names,
                run_after__gt=timezone.now(),
                run_after__lt=get_date_max(),
            )
            .order_by()
            .aggregate(due=Min("run_after"))["due"]
        )

    def run_next(self) -> list[DBTaskResult] | None:
        """Claim and run up to `claim_batch` ready entries; None when there is none.

        The worker keeps its database connection from one entry to the next (a new one
        per entry cost milliseconds of every decision's latency); one that failed is
        dropped by `run` and opened again on the next attempt."""
        self.settle_unsettled()
        try:
            entries = self.claim_many(self.claim_batch)
        except OperationalError as error:
            if is_locked_database_exception(error):  # SQLite busy: try again soon
                return None
            raise
        if not entries:
            return None
        self.unsettled = list(entries)
        self.run_entries(entries)  # writes the outcomes; raises if the database is gone
        self.unsettled = []
        return entries

    def run_entries(self, entries: list[DBTaskResult]) -> None:
        """Approved calls run as one batch (tasks.run_approved_calls) without the task
        framework's per-entry work, and their entries end in one statement per outcome;
        anything else runs as django-tasks-db runs it. A worker asked to stop (SIGTERM)
        finishes the call it is running and puts the batch's other entries back."""
        self.running_task = True  # a SIGTERM now lets the current call finish
        try:
            self._run_entries(entries)
        finally:
            self.running_task = False

    def _run_entries(self, entries: list[DBTaskResult]) -> None:
        calls = [entry for entry in entries if entry.task_path == _APPROVED_CALL]
        ran = set()
        for entry in entries:
            if entry.task_path != _APPROVED_CALL and self.running:
                self.run_task(entry)
                ran.add(entry.pk)
        outcomes: dict[str, str] = {}
        handed_on: set[object] = set()

        def hand_on(approval_ids: list[str]) -> None:
            """A slow call holds this worker: its batch's later calls go back to the queue
            now, for any worker, instead of waiting behind it (or for tasks.LEASE)."""
            rest = [entry.pk for entry in calls if entry.args_kwargs["args"][0] in approval_ids]
            DBTaskResult.objects.filter(pk__in=rest, status=TaskResultStatus.RUNNING).update(
                status=TaskResultStatus.READY, started_at=None
            )
            handed_on.update(rest)
            wake.notify_ready()

        if calls and self.running:
            try:
                outcomes = tasks.run_approved_calls(
                    [entry.args_kwargs["args"][0] for entry in calls],
                    lambda: self.running,
                    hand_on,
                )
            except OperationalError:
                raise
            except Exception:
                # One call broke the batch: each entry again on its own, so its failure is
                # recorded on its entry (calls already run are no longer approved: skipped).
                logger.exception("a batch of approved calls failed; running its entries one by one")
                for entry in calls:
                    self.run_task(entry)
                return
        finished: dict[str, list[str]] = {}
        for entry in calls:
            outcome = outcomes.get(entry.args_kwargs["args"][0])
            if outcome is not None:
                finished.setdefault(outcome, []).append(entry.pk)
        self._run_tasks += sum(len(ids) for ids in finished.values())
        now = timezone.now()
        for outcome, ids in finished.items():
            DBTaskResult.objects.filter(pk__in=ids).update(
                status=TaskResultStatus.SUCCESSFUL,
                finished_at=now,
                return_value=outcome,
                exception_class_path="",
                traceback="",
            )
        ran |= {pk for ids in finished.values() for pk in ids}
        left = [entry.pk for entry in entries if entry.pk not in ran | handed_on]
        if left:  # stopping: not started, so back to the queue for another worker
            DBTaskResult.objects.filter(pk__in=left, status=TaskResultStatus.RUNNING).update(
                status=TaskResultStatus.READY, started_at=None
            )
            wake.notify_ready()  # now, not at its next poll

    def claim(self) -> DBTaskResult | None:
        """The next ready entry, marked RUNNING for this worker."""
        entries = self.claim_many(1)
        return entries[0] if entries else None

    def claim_many(self, limit: int) -> list[DBTaskResult]:
        """Up to `limit` ready entries in queue order, marked RUNNING for this worker. On
        PostgreSQL one statement (UPDATE .. FOR UPDATE SKIP LOCKED .. RETURNING): one round
        trip instead of BEGIN, SELECT, UPDATE, COMMIT; concurrent workers skip each
        other's. A worker killed holding a batch leaves its entries RUNNING: the sweeper
        enqueues their calls again after tasks.LEASE."""
        if connection.vendor != "postgresql":
            ready = DBTaskResult.objects.ready().filter(
                backend_name=self.backend_name, queue_name__in=self.queue_names
            )
            with exclusive_transaction(ready.db):
                entries = list(ready.select_for_update(skip_locked=True)[:limit])
                for entry in entries:
                    entry.claim(self.worker_id)
            return entries
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
                limit,
            ],
        )
        return sorted(claimed, key=lambda e: (-e.priority, e.run_after, e.enqueued_at))

    def settle_unsettled(self) -> None:
        entries, self.unsettled = self.unsettled, []
        if not entries:
            return
        DBTaskResult.objects.filter(
            pk__in=[entry.pk for entry in entries], status="RUNNING"
        ).update(
            status="FAILED",
            finished_at=timezone.now(),
            exception_class_path="django.db.utils.OperationalError",
            traceback="The database went away before this task's outcome was written.",
        )


_APPROVED_CALL = tasks.run_approved_call.module_path
_TABLE = DBTaskResult._meta.db_table
# django-tasks-db's ready() and ordering (its partial index serves the inner SELECT),
# claimed as DBTaskResult.claim does it.
_CLAIM_SQL = f"""
UPDATE {_TABLE}
SET status = %s, started_at = %s, worker_ids = worker_ids || jsonb_build_array(%s::text)
WHERE id IN (
    SELECT id FROM {_TABLE}
    WHERE status = %s AND backend_name = %s AND queue_name = ANY(%s)
      AND (run_after = %s OR run_after <= %s)
    ORDER BY priority DESC, run_after ASC, enqueued_at ASC
    LIMIT %s
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
    claim_batch: int = CLAIM_BATCH,
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
        claim_batch=claim_batch,
    )


class Sweeper(threading.Thread):
    """Expires overdue approvals, re-enqueues lost ones, settles the work of dead
    workers and repairs missing result events, every few seconds; between two sweeps,
    settles the calls whose lease ran out (runner.settle_lapsed_calls) every
    TOOLHUB_LEASE_SWEEP_MS."""

    def __init__(self, every: float = SWEEP_EVERY_S, leases_every: float | None = None) -> None:
        super().__init__(name="toolhub-sweeper", daemon=True)
        self.every = every
        self.leases_every = (
            settings.TOOLHUB_LEASE_SWEEP_MS / 1000 if leases_every is None else leases_every
        )
        self.stopped = threading.Event()
        self.backoff = Backoff("approval sweep")

    def run(self) -> None:
        pause = min(self.every, self.leases_every)
        due = time.monotonic() + self.every
        while not self.stopped.wait(self.backoff.delay or pause):
            try:
                close_old_connections()
                if time.monotonic() < due and not self.backoff.delay:
                    runner.settle_lapsed_calls()
                    continue
                due = time.monotonic() + self.every
                tasks.sweep()
                retention.tick()  # prunes in its own thread, when due
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
    """One worker thread and one sweeper thread in this process (the embedded demo).

    When the server stops (toolhub/server/draining.py), the worker finishes the call it is
    running, as `toolhub_worker` does on SIGTERM, and the process waits for it: the worker
    thread is a daemon, and the process exiting under it left an approved call to the
    sweeper, which records it as failed, never run again."""
    from toolhub.server import draining

    worker = build_worker(f"embedded-{os.getpid()}")
    thread = threading.Thread(target=worker.run, name="toolhub-worker", daemon=True)
    thread.start()
    Sweeper().start()

    def stop() -> asyncio.Future[None]:
        worker.running = False  # the current call finishes; the batch's rest goes back
        wake.work_committed.set()  # an idle worker stops waiting now
        return asyncio.get_running_loop().run_in_executor(None, thread.join)

    draining.on_stop(stop)
    logger.info("embedded task worker started")
