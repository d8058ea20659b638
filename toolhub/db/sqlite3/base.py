"""Django's SQLite backend, with writers queued on locks rather than SQLite's busy handler.

SQLite lets one transaction write at a time. A writer that finds the lock taken is
retried by SQLite's busy handler, which sleeps between tries (1, 2, 5 ... then 100 ms):
under 20 concurrent calls an unlucky writer kept missing its turn, and p99 latency
reached 2 s against a p50 of 0.1 s (issue 13). So a writer takes two locks before
`BEGIN IMMEDIATE`, and frees both at commit, rollback or close:

- a process-wide lock: the threads of one process (the embedded deployment: one Daphne)
  wait their turn on it and wake as soon as it is free;
- an `flock` on a file beside the database (`<database>-writers`, with its `-wal` and
  `-shm`), for the writers of other processes on the same file (one Daphne per core, a
  worker, management commands). Without it, two processes met in SQLite's busy
  handler: the one that lost slept, and under load one process did most of the writing
  while the other waited (two processes served 1.2 times what one did). A writer that
  finds it taken tries again every half millisecond.

Nothing else changes: the same statements, the same transaction mode, and a writer that
waits longer than the database's `timeout` for either lock gets the same "database is
locked" error, with nothing written. An in-memory database has no file to lock, and only
one process can open it.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

_writer = threading.Lock()
RETRY_S = 0.0005  # between tries of another process's lock


class _WritersFile:
    """This process's descriptor of one database's lock file. flock() locks belong to
    the open file, so a forked child opens its own (else parent and child would share
    one lock and not exclude each other)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        # Read-only is enough for flock(): a process of another user that may write the
        # database (group permissions) can lock the file too, as it shares -wal and -shm.
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OperationalError(
                f"cannot open the SQLite writers' lock file {path}: {exc.strerror or exc}"
            ) from exc

    def acquire(self, deadline: float) -> bool:
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(RETRY_S)

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


_files: dict[str, _WritersFile] = {}


def writers_file(database: str) -> _WritersFile:
    """The lock file of `database` (called with this process's writer lock held)."""
    path = f"{database}-writers"
    found = _files.get(path)
    if found is not None and found.pid != os.getpid():
        # Inherited from the parent: closing this copy leaves the parent's lock alone,
        # and keeps this process from holding it on after the parent is gone.
        os.close(found.fd)
        found = None
    if found is None:
        found = _files[path] = _WritersFile(path)
    return found


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False
    _holds_file: _WritersFile | None = None

    def _start_transaction_under_autocommit(self) -> None:
        timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        deadline = time.monotonic() + timeout
        if not _writer.acquire(timeout=timeout):
            raise OperationalError("database is locked (waited for this process's writers)")
        self._holds_writer = True
        try:
            if not self.is_in_memory_db():
                held = writers_file(str(self.settings_dict["NAME"]))
                if not held.acquire(deadline):
                    raise OperationalError(
                        "database is locked (waited for other processes' writers)"
                    )
                self._holds_file = held
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        if self._holds_writer:
            self._holds_writer = False
            held, self._holds_file = self._holds_file, None
            try:
                if held is not None:
                    held.release()
            finally:
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
