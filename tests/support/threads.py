"""Threads a test starts, and the database connections they take.

On PostgreSQL a thread's connection comes from the pool and goes back only when the
thread closes it: a thread that ends without closing keeps its slot checked out for the
rest of the session, and one that lives on (asgiref's executor) keeps a session open on
the test database, so that pytest cannot drop it at the end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import SyncToAsync
from django.db import connections


def in_thread(target: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a thread's body so its own database connections are closed when it ends."""

    def run() -> Any:
        try:
            return target()
        finally:
            connections.close_all()

    return run


def start_thread(target: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=in_thread(target), daemon=True)
    thread.start()
    return thread


def close_executor_connections() -> None:
    """Close what asgiref's shared thread holds. An async test's `sync_to_async` work
    (and Django's ASGI handler, with no request_finished to close it) runs there when no
    outer `async_to_sync` gives it a thread; that thread lives as long as the process.
    Nothing to do before some test has started it."""
    executor = SyncToAsync.single_thread_executor
    if executor._threads:
        executor.submit(connections.close_all).result(timeout=10)
