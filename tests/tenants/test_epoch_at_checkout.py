"""On PostgreSQL's pool, the check of a connection taken from the pool carries the epoch's
read (toolhub/db/postgresql/pool.py, apps/tenants/epoch.py): the read that takes the
connection uses the check's answer, one round trip fewer per request (issue 13). Any
other read goes to the database, so no answer is older than the read that asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from apps.tenants import epoch
from apps.tenants.models import AuthzEpoch
from toolhub.db.postgresql import pool

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _pooled_postgresql() -> Iterator[None]:
    if connection.vendor != "postgresql" or not connection.settings_dict["OPTIONS"].get("pool"):
        pytest.skip("the checkout check is the pool's: this runs in the PostgreSQL leg")
    epoch.read()  # the row exists
    connection.close()  # back to the pool: the next statement takes a connection
    yield
    connection.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per epoch read sent as a statement of its own. (Django's query capture
    opens the connection when it starts, so it cannot show a read that takes one.)"""
    counted: list[int] = []
    original = epoch.statement_cursor

    def counting(wrapper: Any) -> Any:
        counted.append(1)
        return original(wrapper)

    monkeypatch.setattr(epoch, "statement_cursor", counting)
    return counted


def stored() -> int:
    """The epoch as another connection sees it (not through this one's pool)."""
    with psycopg.connect(**connection.get_connection_params()) as other:
        row = other.execute("SELECT value FROM tenants_authzepoch WHERE id = 1").fetchone()
    assert row is not None
    return int(row[0])


def set_elsewhere(value: int) -> None:
    """Another process's edit: a new epoch committed on a connection of its own."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("UPDATE tenants_authzepoch SET value = %s WHERE id = 1", [value])


def test_the_read_that_takes_a_connection_uses_the_checks_answer(sent: list[int]) -> None:
    first = epoch.read()
    assert sent == []  # the check read it
    second = epoch.read()
    assert sent == [1]  # the connection is open now: a statement of its own
    assert first == second == stored()


def test_a_connection_already_open_is_read_afresh(sent: list[int]) -> None:
    """A worker keeps its connection between tasks: an edit made since the checkout is
    seen by the next read, never the check's older answer."""
    connection.ensure_connection()  # the check read the epoch now
    set_elsewhere(111)
    assert epoch.read() == 111
    assert sent == [1]


def test_a_read_inside_a_transaction_goes_to_the_database(sent: list[int]) -> None:
    """A transaction takes the connection when it begins: its reads are its own."""
    with transaction.atomic():
        set_elsewhere(222)
        assert epoch.read() == 222
    assert sent == [1]


def test_the_checks_answer_serves_once(sent: list[int]) -> None:
    epoch.read()  # takes the connection and the check's answer
    assert pool.taken_at_checkout(connection.connection) is pool.NOTHING
    connection.close()
    set_elsewhere(333)
    # Taken again from the pool: the check runs again and answers the new value.
    assert epoch.read() == 333
    assert sent == []


def test_an_own_edit_is_seen_by_the_next_read_of_the_scope() -> None:
    """A bump in the request that took the connection: the scope's next read queries."""
    with epoch.pinned():
        before = epoch.current()  # the check's answer
        epoch.bump()
        after = epoch.current()
    assert after != before
    assert after == stored()


@pytest.mark.parametrize(
    "failing",
    [
        "SELECT value FROM no_such_table WHERE id = 1",  # before `migrate`: no table yet
        "SELECT no_such_column FROM tenants_authzepoch",  # any error of the statement's own
        "SELECT 1 / 0",
    ],
)
def test_a_read_the_database_refuses_still_passes_the_check(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """Before `migrate` there is no epoch table: the check's read fails on the table, but
    the connection answered, so it is handed out, with no answer kept (as for any error
    of the statement's own); the read then runs itself."""
    monkeypatch.setattr(pool, "_checkout_read", failing)
    connection.ensure_connection()
    assert pool.taken_at_checkout(connection.connection) is pool.NOTHING
    with connection.cursor() as cursor:  # usable: not left in a failed transaction
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    connection.close()


def test_a_lost_epoch_row_is_recreated_as_before() -> None:
    """The check answers "no row"; the read then creates one, as a plain read would."""
    AuthzEpoch.objects.filter(pk=epoch.ROW).delete()
    connection.close()
    value = epoch.read()
    assert value == stored()


def plans_of_the_read(conn: Any) -> tuple[int, int] | None:
    """(how many prepared statements of `conn`'s session are the check's read, how many
    times they were executed); None when none is. (The call's statement reads the epoch
    too, inside a longer text.)"""
    row = conn.execute(
        "SELECT count(*), sum(generic_plans + custom_plans) FROM pg_prepared_statements"
        " WHERE statement = %s",
        [pool._checkout_read],
    ).fetchone()
    return None if not row[0] else (int(row[0]), int(row[1]))


def test_the_checks_read_is_prepared_once_and_reused() -> None:
    """The connection's cursors are Django's client-binding ones, which prepare nothing:
    the check's read was planned anew at every checkout (issue 13). It is prepared on
    the first and executed by name on every later one."""
    epoch.read()  # takes a connection: its check read the epoch
    raw = connection.connection
    prepared = plans_of_the_read(raw)
    assert prepared is not None and prepared[0] == 1
    for _ in range(3):  # later checkouts of the same connection
        pool.check(raw)
    assert plans_of_the_read(raw) == (1, prepared[1] + 3)


def test_with_prepared_statements_off_the_check_prepares_nothing() -> None:
    """TOOLHUB_DB_PREPARED_STATEMENTS=0 (a transaction-mode pooler in front) leaves the
    connection's prepare_threshold None: the check's read is sent unprepared."""
    params = {**connection.get_connection_params(), "prepare_threshold": None}
    params.pop("cursor_factory", None)
    with pool.WatchedConnection.connect(**params) as conn:
        pool.check(conn)
        pool.check(conn)
        assert conn.checkout_answer == stored()
        assert plans_of_the_read(conn) is None
