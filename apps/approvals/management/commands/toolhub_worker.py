from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.approvals.worker import POLL_EVERY_S, Sweeper, build_worker, start_push_loop
from toolhub.server.startup import freeze_start_up


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
        # What start-up built lives as long as the worker: no full collection walks it.
        freeze_start_up()
        start_push_loop()
        sweeper = Sweeper()
        sweeper.start()
        try:
            worker.run()
        finally:
            sweeper.stopped.set()
