"""The SQLite backend queues writers on locks (toolhub/db/sqlite3/base.py): one process's
threads on a lock, and every process on an flock beside the database. A writer waits for
them instead of SQLite's sleeping busy handler, they are freed however a transaction
ends, and waiting too long gives SQLite's own error (issue 13)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import OperationalError, connection, transaction

from apps.tenants.models import Tenant
from tests.support.server import ROOT, database_url
from tests.support.threads import start_thread
from toolhub.db.sqlite3 import base

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite backend only"),
    pytest.mark.django_db(transaction=True),
]


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

    threads = [start_thread(first), start_thread(second)]
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

    start_thread(abandon).join(10)
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

    holder = start_thread(hold)
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


# ---------------------------------------------------------------- writers of other processes

# A real toolhub process on the tests' database: it writes a tenant in a transaction it
# holds open until told to end it on stdin ("commit" or "rollback").
_HOLDER = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django.db import transaction
    from apps.tenants.models import Tenant
    with transaction.atomic():
        Tenant.objects.create(slug=sys.argv[1], name="Other process")
        print("holding", flush=True)
        if sys.stdin.readline().strip() == "rollback":
            transaction.set_rollback(True)
    print("ended", flush=True)
    """
)


@contextmanager
def other_process_writing(slug: str) -> Iterator[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "toolhub.settings",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, slug],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)


def end(holder: subprocess.Popen[str], how: str) -> None:
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write(how + "\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "ended"
    assert holder.wait(10) == 0


def file_is_free() -> bool:
    """Whether another open file (as another process would) can take the flock now."""
    fd = os.open(f"{connection.settings_dict['NAME']}-writers", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_writer_waits_for_another_process_writer_and_then_writes() -> None:
    done = threading.Event()

    def write() -> None:
        with transaction.atomic():
            Tenant.objects.create(slug="after-other", name="After")
        done.set()

    with other_process_writing("other-commits") as holder:
        assert not file_is_free()
        writer = start_thread(write)
        assert not done.wait(0.3)  # still waiting on the other process's lock
        assert base._writer.locked()  # ... holding this process's own meanwhile
        end(holder, "commit")
        writer.join(10)
    assert done.is_set()
    assert set(Tenant.objects.values_list("slug", flat=True)) >= {"other-commits", "after-other"}
    assert not base._writer.locked()
    assert file_is_free()


@pytest.mark.parametrize("how", ["rollback", "kill"])
def test_another_process_that_rolls_back_or_dies_frees_the_file_lock(how: str) -> None:
    slug = f"other-{how}"
    with other_process_writing(slug) as holder:
        if how == "kill":
            holder.kill()
            holder.wait(10)
        else:
            end(holder, how)
    assert file_is_free()
    with transaction.atomic():
        Tenant.objects.create(slug=f"after-{how}", name="After")
    assert not Tenant.objects.filter(slug=slug).exists()


def test_waiting_past_the_timeout_for_another_process_is_database_is_locked() -> None:
    with other_process_writing("other-holds") as holder:
        connection.settings_dict["OPTIONS"] = {
            **connection.settings_dict["OPTIONS"],
            "timeout": 0.2,
        }
        try:
            with (
                pytest.raises(OperationalError, match="other processes' writers"),
                transaction.atomic(),
            ):
                Tenant.objects.create(slug="too-late", name="Late")
        finally:
            connection.settings_dict["OPTIONS"] = {
                **connection.settings_dict["OPTIONS"],
                "timeout": 20,
            }
        # Both locks freed by the refusal: this process's other threads are not stuck.
        assert not base._writer.locked()
        end(holder, "commit")
    assert not Tenant.objects.filter(slug="too-late").exists()
    with transaction.atomic():
        Tenant.objects.create(slug="in-time", name="In time")


# The child only opens a file, tries a lock and exits: none of the other threads' locks.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_locks_against_its_parent() -> None:
    """flock() locks belong to the open file: a child that reused its parent's descriptor
    would share the parent's lock instead of waiting for it."""
    parent = base.writers_file(str(connection.settings_dict["NAME"]))
    assert parent.acquire(0)
    try:
        pid = os.fork()
        if pid == 0:  # the child: must not get the lock its parent holds
            child = base.writers_file(str(connection.settings_dict["NAME"]))
            # The inherited copy is closed (its number free, or reused by the new one).
            try:
                inherited_closed = child.fd == parent.fd or not os.fstat(parent.fd)
            except OSError:
                inherited_closed = True
            ok = child is not parent and inherited_closed and not child.acquire(0)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        parent.release()


def test_a_lock_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    """A database in a directory that is gone (or not writable): SQLite's own error
    names the database; the lock file's names the lock file, not a bare OSError."""
    missing = tmp_path / "gone" / "toolhub.sqlite3"
    with pytest.raises(OperationalError, match=r"writers' lock file .*gone.*No such file"):
        base.writers_file(str(missing))
