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
  next request starts a fresh attempt as soon as the database is back;
- the check can carry a read the statement that takes the connection would send anyway
  (`read_at_checkout`: the authorization epoch, apps/tenants/epoch.py), so that a request
  makes one round trip fewer (issue 13). Its answer is kept on the connection for that
  one statement (`taken_at_checkout`); any later one reads afresh.
"""

from __future__ import annotations

import contextlib
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


NOTHING: Any = object()  # no answer kept from the checkout check


class WatchedConnection(psycopg.Connection[Any]):
    checkout_answer: Any = NOTHING  # what the checkout check's read answered, until taken

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


_checkout_read: str | None = None  # see read_at_checkout


def read_at_checkout(sql: str | None) -> None:
    """Have every checkout check send `sql`, a read of one value, instead of an empty
    query. Its answer is for the statement that takes the connection (taken_at_checkout):
    the check runs at that statement's start, so the answer is as fresh as its own read."""
    global _checkout_read
    _checkout_read = sql


def taken_at_checkout(conn: Any) -> Any:
    """What the checkout check's read answered for `conn` (None: no row), once; NOTHING
    when it sent none or it was taken already."""
    answer = getattr(conn, "checkout_answer", NOTHING)
    if answer is not NOTHING:
        conn.checkout_answer = NOTHING
    return answer


def _checked(conn: psycopg.Connection[Any]) -> None:
    sql = _checkout_read
    if sql is None or not isinstance(conn, WatchedConnection):
        ConnectionPool.check_connection(conn)
        return
    conn.checkout_answer = NOTHING
    restore = not conn.autocommit
    conn.autocommit = True  # as psycopg's own check: outside any transaction
    try:
        try:
            # psycopg's own server-binding cursor: the connection's factory is Django's
            # client-binding cursor, which prepares nothing, and an unprepared read was
            # planned anew at every checkout (a tenth of the server's time per call).
            # With prepared statements off (TOOLHUB_DB_PREPARED_STATEMENTS=0), none is.
            with psycopg.Cursor(conn) as cursor:
                row = cursor.execute(sql, prepare=True).fetchone()
        except psycopg.DatabaseError as error:
            if isinstance(error, psycopg.OperationalError) or conn.broken:
                raise  # the connection or the server failed: what the check is for
            # The server answered with an error of the statement's own (no table before
            # `migrate`, no privilege): the connection works, which is all a check needs;
            # the read that takes it runs itself and meets that error as it would have.
            return
        conn.checkout_answer = None if row is None else row[0]
    finally:
        if restore:
            with contextlib.suppress(Exception):  # a broken connection raises its own error
                conn.autocommit = False


def check(conn: psycopg.Connection[Any]) -> None:
    """The pool's checkout check: a broken connection is discarded, with its idle peers,
    and one direct connection tells a restart (accepted: the pool makes new ones) from
    an outage (refused: `Unreachable`)."""
    try:
        _checked(conn)
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
