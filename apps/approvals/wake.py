"""Waking task workers when work is committed, instead of letting them poll.

An enqueue sends `NOTIFY toolhub_tasks` in its own transaction (PostgreSQL
delivers it at commit, so a woken worker always finds the entry) and, after
commit, sets this process's event for an embedded worker. Workers still poll
every few seconds as the safety net: a notification is not stored, so one sent
while a worker was reconnecting is simply lost.
"""

from __future__ import annotations

import contextlib
import logging
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
    """LISTENs on a connection of its own and sets `work_committed` per notification."""

    def __init__(self) -> None:
        super().__init__(name="toolhub-listener", daemon=True)
        self.stopped = threading.Event()

    def run(self) -> None:
        delay = 0.5
        while not self.stopped.is_set():
            db = connections.create_connection("default")
            try:
                db.ensure_connection()
                db.set_autocommit(True)
                raw = db.connection
                raw.execute(f"LISTEN {CHANNEL}")
                work_committed.set()  # anything committed while we were away
                delay = 0.5
                while not self.stopped.is_set():
                    for _ in raw.notifies(timeout=1.0):
                        work_committed.set()
            except Exception as error:
                logger.warning(
                    "task listener lost its database connection (%s); polling meanwhile, "
                    "reconnecting in %.1f s",
                    _one_line(error),
                    delay,
                )
                self.stopped.wait(delay)
                delay = min(delay * 2, LISTEN_RETRY_MAX_S)
            finally:
                with contextlib.suppress(Exception):
                    # A pooled connection goes back to the pool: not still listening.
                    raw = db.connection
                    raw.execute(f"UNLISTEN {CHANNEL}")
                with contextlib.suppress(Exception):
                    db.close()


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
