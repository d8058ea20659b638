"""Django's PostgreSQL backend; with the pool on, a request fails at once while the
database is down.

With the pool, a request that finds no idle connection waits for the pool to make one,
up to its timeout (TOOLHUB_DB_POOL_TIMEOUT), even when the pool's attempts to connect
keep failing: during an outage every request would take that long to get its 503. When
the pool's last attempt failed (pool.reachability), a request connects directly first:
refused, it fails now with PostgreSQL's own error (the outage middleware answers 503);
accepted, the database is back and the request takes its connection from the pool.
The first request of an outage finds an idle connection, broken: the pool's check
(pool.check) then tries one direct connection and, refused, fails the request at once.

`prepared_cursor()` is for the few statements sent thousands of times a minute with the
same text (the call path's, through `toolhub.db.postgresql.statement_cursor`): Django's
cursors bind parameters on the client, so PostgreSQL parses, analyses and plans every one
anew (about 60 % of its CPU per queued call, perf during `bench/decision.py --throughput`).
Its cursor also keeps psycopg's conversion of each text (`%s` to `$1`, `_KeptQuery`):
psycopg keeps it only for texts under 4 KiB with at most 50 values, and a worker's start
of several calls (apps/invocations/combined.write_many) is longer.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

import psycopg
from django.db.backends.postgresql import base, operations
from django.db.backends.utils import CursorWrapper
from psycopg._queries import PostgresQuery, _query2pg_nocache

from toolhub.db.postgresql.pool import Unreachable, probe, reachability


class DatabaseOperations(operations.DatabaseOperations):
    def last_executed_query(self, cursor: Any, sql: str, params: Any) -> str:
        """What Django's query log shows (debug, tests): a prepared statement's execution
        leaves psycopg no query text of its own, so show the one sent, values quoted in."""
        if isinstance(cursor, _PreparingCursor):
            try:
                return str(self.compose_sql(sql, params))
            except psycopg.DataError:  # a value psycopg cannot quote on the client
                pass
        return str(super().last_executed_query(cursor, sql, params))


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        if self.pool is not None and reachability.down:
            timeout = int(self.settings_dict["OPTIONS"]["pool"].get("timeout", 5))
            probe("", conn_params, timeout)
        try:
            return super().get_new_connection(conn_params)
        except Unreachable as unreachable:  # a pooled connection broke, and so do new ones
            raise unreachable.error from None

    def prepared_cursor(self) -> CursorWrapper:
        """A cursor that binds its parameters on the server and prepares what it sends:
        PostgreSQL parses a statement once per connection (psycopg keeps the last 100 of
        each connection, keyed by text and parameter types) and, once it has chosen a
        generic plan, stops planning it. Wrapped as Django's own cursors are (execute
        wrappers, query logging, database errors). Its values come back with psycopg's
        loaders, not Django's time zone one: select no timestamps with it."""
        self.ensure_connection()
        self.validate_thread_sharing()
        with self.wrap_database_errors:
            cursor = cast(Any, self._free_prepared_cursor())  # wrapped by what follows
        if self.queries_logged:
            return self.make_debug_cursor(cursor)
        return self.make_cursor(cursor)

    def _free_prepared_cursor(self) -> _PreparingCursor:
        """The connection's kept cursor when it is free, else a new one. A cursor kept
        across statements keeps psycopg's adaptation state: sent the same text again, it
        skips finding each parameter's dumper anew (about a fifth of sending a queued
        call's start, issue 13). A cursor asked for while the kept one is in use (one
        statement read while another is) is a one-off, closed as usual."""
        kept: _PreparingCursor | None = getattr(self, "_kept_cursor", None)
        if kept is not None and kept.connection is self.connection and not kept.in_use:
            kept.in_use = True
            return kept
        cursor = _PreparingCursor(self.connection)
        if kept is None or kept.connection is not self.connection:
            cursor.kept = cursor.in_use = True
            self._kept_cursor = cursor  # the last connection's, if any, is let go
        return cursor


# Texts whose conversion is kept: the call path's statement shapes are a few dozen.
KEPT_CONVERSIONS = 256


@lru_cache(maxsize=KEPT_CONVERSIONS)
def _converted(query: str, encoding: str) -> Any:
    return _query2pg_nocache(query.encode(encoding), encoding)


class _KeptQuery(PostgresQuery):
    """psycopg's query, its text's conversion (placeholders to `$n`, the values' order
    and formats) kept whatever its length: psycopg keeps it only for texts under 4 KiB
    with at most 50 values (psycopg/_queries.py, for ORMs' ever-changing texts), and
    redid it for every start of several calls (issue 13: a quarter of a worker's main
    thread). Only the prepared cursor uses it, whose texts take a few shapes."""

    def convert(self, query: Any, vars: Any) -> None:
        if vars is None or not isinstance(query, str):
            super().convert(query, vars)
            return
        self.query, self._want_formats, self._order, self._parts = _converted(
            query, self._tx.encoding
        )
        self.dump(vars)


class _PreparingCursor(psycopg.Cursor[Any]):
    """psycopg's server-binding cursor, preparing every statement it sends (with Django's
    prepare_threshold of None, the connection's setting, nothing is prepared). The one a
    connection keeps (`kept`) is not closed when a statement is done with it, only freed
    for the next (DatabaseWrapper._free_prepared_cursor)."""

    _query_cls = _KeptQuery
    kept = False
    in_use = False

    def close(self) -> None:
        if self.kept:
            self.in_use = False
        else:
            super().close()

    def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = True,
        binary: bool | None = None,
    ) -> Any:
        return super().execute(query, params, prepare=prepare, binary=binary)
