"""The SQLite backend queues one process's writers on a lock (toolhub/sqlite3/base.py):
a writer waits for the lock instead of SQLite's sleeping busy handler, the lock is freed
however a transaction ends, and waiting too long gives SQLite's own error (issue 13)."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, close_old_connections, connection, transaction

from apps.tenants.models import Tenant
from toolhub.sqlite3 import base

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite backend only"),
    pytest.mark.django_db(transaction=True),
]


def in_thread(target: object) -> threading.Thread:
    def run() -> None:
        try:
            target()  # type: ignore[operator]
        finally:
            close_old_connections()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_second_writer_begins_only_once_the_first_commits() -> None:
    order: list[str] = []
    first_inside = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with transaction.atomic():
            Tenant.objects.create(slug="first", name="First")
            order.append("first in")
            first_inside.set()
            release_first.wait(5)
            order.append("first out")

    def second() -> None:
        first_inside.wait(5)
        with transaction.atomic():
            order.append("second in")
            Tenant.objects.create(slug="second", name="Second")

    threads = [in_thread(first), in_thread(second)]
    first_inside.wait(5)
    assert base._writer.locked()
    release_first.set()
    for thread in threads:
        thread.join(10)
    assert order == ["first in", "first out", "second in"]
    assert set(Tenant.objects.values_list("slug", flat=True)) >= {"first", "second"}
    assert not base._writer.locked()


def test_the_lock_is_freed_by_a_rollback_and_by_a_closed_connection() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Tenant.objects.create(slug="gone", name="Gone")
        raise RuntimeError
    assert not base._writer.locked()
    assert not Tenant.objects.filter(slug="gone").exists()

    def abandon() -> None:
        transaction.atomic().__enter__()  # a transaction its thread never ends
        Tenant.objects.create(slug="abandoned", name="Abandoned")
        connection.close()

    in_thread(abandon).join(10)
    assert not base._writer.locked()
    with transaction.atomic():
        Tenant.objects.create(slug="after", name="After")


def test_a_writer_that_waits_past_the_timeout_gets_database_is_locked(
    settings: object,
) -> None:
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Tenant.objects.create(slug="holder", name="Holder")
            holding.set()
            done.wait(10)

    holder = in_thread(hold)
    holding.wait(5)
    connection.settings_dict["OPTIONS"] = {**connection.settings_dict["OPTIONS"], "timeout": 0.2}
    try:
        with pytest.raises(OperationalError, match="database is locked"), transaction.atomic():
            Tenant.objects.create(slug="late", name="Late")
    finally:
        connection.settings_dict["OPTIONS"] = {**connection.settings_dict["OPTIONS"], "timeout": 20}
        done.set()
        holder.join(10)
    assert not base._writer.locked()
