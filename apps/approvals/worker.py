"""Task workers: separate processes (`manage.py toolhub_worker`) or, for the
embedded demo, threads inside the web process (TOOLHUB_EMBEDDED_WORKER=1)."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.db import close_old_connections
from django_tasks_db.management.commands.db_worker import Worker

from apps.approvals import tasks

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0


def build_worker(
    worker_id: str | None = None, *, interval: float = 0.5, batch: bool = False
) -> Worker:
    return Worker(
        queue_names=["default"],
        interval=interval,
        batch=batch,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id=worker_id or f"{socket.gethostname()}-{os.getpid()}"[:64],
        excluded_queue_names=[],
    )


class Sweeper(threading.Thread):
    """Expires overdue approvals and re-enqueues lost ones, every few seconds."""

    def __init__(self, every: float = SWEEP_EVERY_S) -> None:
        super().__init__(name="toolhub-sweeper", daemon=True)
        self.every = every
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                close_old_connections()
                tasks.sweep()
            except Exception:
                logger.exception("approval sweep failed; retrying in %.0f s", self.every)
            finally:
                close_old_connections()


def start_embedded() -> None:
    """One worker thread and one sweeper thread in this process (the embedded demo)."""
    worker = build_worker(f"embedded-{os.getpid()}")
    threading.Thread(target=worker.run, name="toolhub-worker", daemon=True).start()
    Sweeper().start()
    logger.info("embedded task worker started")
