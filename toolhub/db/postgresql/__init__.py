"""Django's PostgreSQL backend with psycopg's pool, failing fast while the database is down,
and prepared statements for the call path's own statements."""

from __future__ import annotations

from typing import Any


def statement_cursor(connection: Any) -> Any:
    """A cursor for one of the call path's statements whose text is built once (a call's
    record, events, run counter and the authorization epoch; a queued call's start): on
    toolhub's PostgreSQL backend it binds its values on the server and prepares what it
    sends (base.DatabaseWrapper.prepared_cursor), elsewhere (SQLite) it is Django's own."""
    prepared = getattr(connection, "prepared_cursor", None)
    return prepared() if prepared is not None else connection.cursor()
