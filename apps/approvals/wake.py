"""Waking task workers when work is committed, instead of letting them poll.

An enqueue sends `NOTIFY toolhub_tasks` in its own transaction (PostgreSQL
delivers it at commit, so a woken worker always finds the entry) and, after
commit, sets this process's event for an embedded worker. Workers still poll as
the safety net: every few seconds while no listener is listening (a notification is
not stored, so one sent while a listener was reconnecting is lost), and rarely while
one is (worker.LISTENING_POLL_S).

An idle listener costs nothing: it sleeps in the kernel until its connection's socket
or its stop pipe is readable (psycopg's own `notifies(timeout=)` wakes ten times a
second to look for an interrupt, which was a third of an idle process's CPU).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from typing import Any

from django.db import connection, connections, transaction
from django.dispatch import receiver
from django.tasks.signals import task_enqueued

logger = logging.getLogger(__name__)

CHANNEL = "toolhub_tasks"
# The listener reconnects after at most this long when its connection fails.
LISTEN_RETRY_MAX_S = 10.0

work_committed = threading.Event()


@receiver(task_enqueued)
def _on_enqueued(sender: Any, **kwargs: Any) -> None:
    notify_ready()


def notify_ready() -> None:
    """Entries became ready (enqueued, or put back by a worker that hands its batch on):
    wake the workers, in every process, once the caller's transaction commits."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    transaction.on_commit(work_committed.set)


def wait(seconds: float) -> None:
    """Sleep until work is committed or `seconds` pass."""
    if work_committed.wait(seconds):
        work_committed.clear()


class Listener(threading.Thread):
    """LISTENs on a connection of its own and sets `work_committed` per notification.

    `listening` is set while its LISTEN is in place (a worker then polls rarely);
    `stop()` ends it at once, from any thread."""

    def __init__(self) -> None:
        super().__init__(name="toolhub-listener", daemon=True)
        self.stopped = threading.Event()
        self.listening = threading.Event()
        self._stop_lock = threading.Lock()
        self._stop_read = self._stop_write = -1  # the stop pipe, while it runs

    def stop(self) -> None:
        with self._stop_lock:
            self.stopped.set()
            if self._stop_write >= 0:
                os.write(self._stop_write, b"x")

    def run(self) -> None:
        with self._stop_lock:
            if self.stopped.is_set():
                return
            self._stop_read, self._stop_write = os.pipe()
        try:
            self._listen()
        finally:
            self.listening.clear()
            with self._stop_lock:
                for fd in (self._stop_read, self._stop_write):
                    os.close(fd)
                self._stop_read = self._stop_write = -1

    def _listen(self) -> None:
        delay = 0.5
        while not self.stopped.is_set():
            db = connections.create_connection("default")
            try:
                db.ensure_connection()
                db.set_autocommit(True)
                raw = db.connection
                raw.execute(f"LISTEN {CHANNEL}")
                self.listening.set()
                work_committed.set()  # anything committed while we were away
                delay = 0.5
                with selectors.DefaultSelector() as selector:
                    selector.register(raw.fileno(), selectors.EVENT_READ)
                    selector.register(self._stop_read, selectors.EVENT_READ)
                    while not self.stopped.is_set():
                        selector.select()  # no timeout: a stop writes to the pipe
                        if self.stopped.is_set():
                            break
                        # Readable: notifications, or the server closing the connection,
                        # which this read raises as an OperationalError.
                        for _ in raw.notifies(timeout=0):
                            work_committed.set()
            except Exception as error:
                self.listening.clear()
                work_committed.set()  # its worker goes back to polling at once
                logger.warning(
                    "task listener lost its database connection (%s); polling meanwhile, "
                    "reconnecting in %.1f s",
                    _one_line(error),
                    delay,
                )
                self.stopped.wait(delay)
                delay = min(delay * 2, LISTEN_RETRY_MAX_S)
            finally:
                self.listening.clear()
                with contextlib.suppress(Exception):
                    # A pooled connection goes back to the pool: not still listening.
                    raw = db.connection
                    raw.execute(f"UNLISTEN {CHANNEL}")
                with contextlib.suppress(Exception):
                    db.close()


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
