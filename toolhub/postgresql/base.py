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
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from toolhub.postgresql.pool import Unreachable, probe, reachability


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        if self.pool is not None and reachability.down:
            timeout = int(self.settings_dict["OPTIONS"]["pool"].get("timeout", 5))
            probe("", conn_params, timeout)
        try:
            return super().get_new_connection(conn_params)
        except Unreachable as unreachable:  # a pooled connection broke, and so do new ones
            raise unreachable.error from None
