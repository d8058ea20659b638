from __future__ import annotations

import gc
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.approvals.worker import POLL_EVERY_S, Sweeper, build_worker, start_push_loop


class Command(BaseCommand):
    help = (
        "Run approved tool calls and notifications from the durable queue, and expire "
        "overdue approvals. Run as many as you like, on any machine sharing the database. "
        "It outlives database outages: errors are logged and retried with backoff."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=POLL_EVERY_S,
            help="seconds between polls (the safety net: new work wakes the worker at once)",
        )
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--batch", action="store_true", help="exit when the queue is empty")

    def handle(self, *args: Any, **options: Any) -> None:
        worker = build_worker(
            options["worker_id"], interval=options["interval"], batch=options["batch"]
        )
        worker.configure_signals()
        # As toolhub.asgi does for the server: what start-up built (about 200,000 objects)
        # lives as long as the worker, so no full collection walks it again. In
        # bench/decision.py each such walk took 90-180 ms of a worker's time.
        gc.freeze()
        start_push_loop()
        sweeper = Sweeper()
        sweeper.start()
        try:
            worker.run()
        finally:
            sweeper.stopped.set()
