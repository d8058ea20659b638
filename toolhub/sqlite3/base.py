"""Django's SQLite backend, with the writers of one process queued on a lock.

SQLite lets one transaction write at a time. A writer that finds the lock taken is
retried by SQLite's busy handler, which sleeps between tries (1, 2, 5 ... then 100 ms):
under 20 concurrent calls an unlucky writer kept missing its turn, and p99 latency
reached 2 s against a p50 of 0.1 s (issue 13). Here a process-wide lock is taken before
`BEGIN IMMEDIATE` and released at commit, rollback or close, so the threads of one
process (the embedded deployment: one Daphne) wait their turn on the lock and wake as
soon as it is free. Writers in other processes (tests' servers, management commands)
still meet SQLite's own lock and its busy handler, as before.

Nothing else changes: the same statements, the same transaction mode, and a writer that
waits longer than the database's `timeout` gets the same "database is locked" error.
"""

from __future__ import annotations

import threading

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

_writer = threading.Lock()


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False

    def _start_transaction_under_autocommit(self) -> None:
        timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        if not _writer.acquire(timeout=timeout):
            raise OperationalError("database is locked (waited for this process's writers)")
        self._holds_writer = True
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        if self._holds_writer:
            self._holds_writer = False
            _writer.release()

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]
        finally:
            self._release_writer()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]
        finally:
            self._release_writer()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]
        finally:
            self._release_writer()
