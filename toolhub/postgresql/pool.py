"""How the psycopg pool meets a PostgreSQL restart or outage.

psycopg's pool, as Django sets it up, hands out an idle connection without looking at
it (a connection broken by a restart fails the request that gets it), and a request
that finds none waits the pool's whole timeout, also while its background attempts to
connect keep failing; those attempts back off (1, 2, 4 ... s), so after an outage the
pool could stay empty for as long again. Here:

- `check` runs an empty query on each checkout (one round trip, far cheaper than the
  backend fork a new connection costs) and, when it fails, drains the pool: a restart
  breaks every idle connection at once, and testing them one by one would make the
  request sleep between tries;
- `WatchedConnection` notes whether the pool's last attempt to connect failed, so that
  the backend (base.py) fails a request at once while the database is down instead of
  letting it wait the pool timeout;
- a short `reconnect_timeout` ends a run of backed-off attempts within seconds, so the
  next request starts a fresh attempt as soon as the database is back.
"""

from __future__ import annotations

import threading
from typing import Any, Self

import psycopg
from psycopg_pool import ConnectionPool

RECONNECT_S = 2.0


class _Reachability:
    """Whether the pool's last attempt to connect failed (process-wide, like the pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down = False

    @property
    def down(self) -> bool:
        return self._down

    def note(self, *, reached: bool) -> None:
        with self._lock:
            self._down = not reached


reachability = _Reachability()


class WatchedConnection(psycopg.Connection[Any]):
    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        try:
            conn = super().connect(conninfo, **kwargs)
        except psycopg.OperationalError:
            reachability.note(reached=False)
            raise
        reachability.note(reached=True)
        return conn


class Unreachable(BaseException):
    """PostgreSQL refused a new connection right after a pooled one failed its check.

    The pool's checkout loop retries any `Exception` until the pool timeout: the first
    request of an outage would wait all of it for its 503. This is a `BaseException`
    so that it leaves the loop at once; the backend (base.py) turns it back into the
    `OperationalError` it carries, which Django and the outage middleware handle."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


def check(conn: psycopg.Connection[Any]) -> None:
    """The pool's checkout check: a broken connection is discarded, with its idle peers,
    and one direct connection tells a restart (accepted: the pool makes new ones) from
    an outage (refused: `Unreachable`)."""
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool = getattr(conn, "_pool", None)  # set by the pool before it checks
        if isinstance(pool, ConnectionPool):
            pool.drain()
            _probe(pool)
        raise


def probe(conninfo: str, kwargs: dict[str, Any], timeout: float) -> None:
    """One direct connection, closed at once; refused, it raises PostgreSQL's
    OperationalError. Either way `reachability` notes the outcome (WatchedConnection)."""
    WatchedConnection.connect(
        conninfo, **{**kwargs, "connect_timeout": max(1, round(timeout))}
    ).close()


def _probe(pool: ConnectionPool[Any]) -> None:
    kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
    try:
        probe(conninfo, kwargs, pool.timeout)
    except psycopg.OperationalError as error:
        raise Unreachable(error) from error


POOL_OPTIONS: dict[str, object] = {
    "name": "toolhub",
    "check": check,
    "connection_class": WatchedConnection,
    "reconnect_timeout": RECONNECT_S,
}
