"""The runner's grant check, cached per process under the authorization epoch (issue 13),
still answers from the rows as they are now: each write to a grant or a connection holds
on the very next call, a grant that expires stops working with no edit at all, and a run's
grants never reach another run. Every call here comes after warm-up calls, so a stale
cache would show."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection as db
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.connections import grants
from apps.connections.models import Connection, Grant
from apps.tenants import epoch
from apps.tenants.models import Tenant
from tests.conftest import Agent, allow, make_agent
from tests.connections import (
    HTTP,
    LocalServer,
    grant,
    local_server,
    make_connection,
    permit_use,
)
from tests.support.responses import failure, ok_result

pytestmark = pytest.mark.django_db(transaction=True)

NOT_GRANTED = "That connection is not granted to this caller."
OUTSIDE = "http://elsewhere.example.net/"  # refused by the allowlist, after the check


@pytest.fixture
def caller(agent: Agent) -> Agent:
    allow(agent.tenant, HTTP, name="http")
    return agent


def outcome(agent: Agent, connection: Connection, **body: Any) -> str:
    """ "granted" when the call got past step 4 (the host allowlist stopped it), else the
    refusal's code; a refusal for want of a grant must say exactly what a forged id gets."""
    code, message = failure(
        agent.invoke(HTTP, args={"url": OUTSIDE}, connectionId=str(connection.pk), **body)
    )
    if code == "execution" and "does not allow requests to" in message:
        return "granted"
    if code == "policy_denied":
        assert message == NOT_GRANTED
    return code


def warm(agent: Agent, connection: Connection, **body: Any) -> None:
    for _ in range(2):
        assert outcome(agent, connection, **body) == "granted"


def usable_connection(agent: Agent, **fields: Any) -> tuple[Connection, Grant]:
    connection = make_connection(agent.tenant)
    permit_use(connection)
    return connection, grant(connection, agent.principal, **fields)


# ---------------------------------------------------------------- writes hold at once


def revoke_by_save(connection: Connection, the_grant: Grant) -> None:
    the_grant.revoke()


def revoke_in_bulk(connection: Connection, the_grant: Grant) -> None:
    assert Grant.objects.filter(pk=the_grant.pk).update(revoked_at=timezone.now()) == 1


def expire_in_bulk(connection: Connection, the_grant: Grant) -> None:
    past = timezone.now() - timedelta(seconds=1)
    Grant.objects.filter(connection=connection).update(expires_at=past)


def delete(connection: Connection, the_grant: Grant) -> None:
    the_grant.delete()


def delete_in_bulk(connection: Connection, the_grant: Grant) -> None:
    Grant.objects.filter(connection=connection).delete()


def delete_the_connection(connection: Connection, the_grant: Grant) -> None:
    connection.delete()  # its grants go by cascade


def move_the_connection(connection: Connection, the_grant: Grant) -> None:
    """To another tenant, in bulk: its grant rows stay, but name a foreign connection."""
    Connection.objects.filter(pk=connection.pk).update(tenant=Tenant.objects.get(slug="globex"))


TAKE_AWAY: dict[str, Callable[[Connection, Grant], None]] = {
    "a grant revoked (save)": revoke_by_save,
    "a grant revoked (bulk update)": revoke_in_bulk,
    "a grant expired (bulk update)": expire_in_bulk,
    "a grant deleted": delete,
    "grants deleted (bulk delete)": delete_in_bulk,
    "the connection deleted": delete_the_connection,
    "the connection moved to another tenant (bulk update)": move_the_connection,
}


@pytest.mark.parametrize("edit", sorted(TAKE_AWAY))
def test_a_write_taking_a_grant_away_holds_on_the_next_call(caller: Agent, edit: str) -> None:
    connection, the_grant = usable_connection(caller)
    Tenant.objects.create(slug="globex", name="Globex")
    warm(caller, connection)
    before = epoch.read()
    TAKE_AWAY[edit](connection, the_grant)
    assert epoch.read() != before  # in the write's own transaction
    assert outcome(caller, connection) == "policy_denied"


def test_a_grant_created_holds_on_the_next_call(caller: Agent) -> None:
    connection = make_connection(caller.tenant)
    permit_use(connection)
    for _ in range(2):
        assert outcome(caller, connection) == "policy_denied"
    grant(connection, caller.principal)
    assert outcome(caller, connection) == "granted"


def test_a_grant_given_back_by_a_bulk_update_holds_on_the_next_call(caller: Agent) -> None:
    connection, the_grant = usable_connection(caller, revoked_at=timezone.now())
    for _ in range(2):
        assert outcome(caller, connection) == "policy_denied"
    Grant.objects.filter(pk=the_grant.pk).update(revoked_at=None)
    assert outcome(caller, connection) == "granted"


def test_a_secret_saved_alone_changes_the_epoch_and_is_sent_on_the_next_call(
    caller: Agent,
) -> None:
    """The broker caches connection rows, ciphertext included, under the epoch: a secret
    saved on its own (rotate_connection_keys, or a script) must change it."""
    connection, _ = usable_connection(caller)
    warm(caller, connection)
    before = epoch.read()
    connection.set_secret(token="token-rotated-0123")
    connection.save(update_fields=["secret_encrypted"])
    assert epoch.read() != before


def test_the_admins_revoke_action_changes_the_epoch_once_and_holds_at_once(
    caller: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection, first = usable_connection(caller)
    second = grant(connection, caller.principal)
    warm(caller, connection)
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-1234"))
    bumps: list[int] = []
    real = epoch.bump

    def counted(*args: Any, **kwargs: Any) -> None:
        bumps.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(epoch, "bump", counted)
    response = staff.post(
        "/admin/connections/grant/",
        {"action": "revoke", "_selected_action": [first.pk, second.pk]},
    )
    assert response.status_code == 302
    assert not Grant.objects.filter(revoked_at__isnull=True).exists()
    assert len(bumps) == 1
    assert outcome(caller, connection) == "policy_denied"


# ---------------------------------------------------------------- expiry needs no edit


def test_a_grant_expiring_between_two_calls_stops_the_second_with_no_edit(
    caller: Agent,
) -> None:
    expires_at = timezone.now() + timedelta(seconds=1)
    connection, _ = usable_connection(caller, expires_at=expires_at)
    warm(caller, connection)
    cached_at = epoch.read()
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.05)
    assert outcome(caller, connection) == "policy_denied"
    assert epoch.read() == cached_at  # nothing was written: the clock alone did it


def test_the_latest_of_several_grants_is_the_one_that_counts(caller: Agent) -> None:
    soon = timezone.now() + timedelta(seconds=1)
    connection, _ = usable_connection(caller, expires_at=soon)
    grant(connection, caller.principal, expires_at=soon + timedelta(minutes=5))
    warm(caller, connection)
    time.sleep(max(0.0, (soon - timezone.now()).total_seconds()) + 0.05)
    assert outcome(caller, connection) == "granted"


# ---------------------------------------------------------------- runs


def test_a_run_grant_never_reaches_another_run_or_a_call_without_one(caller: Agent) -> None:
    connection, _ = usable_connection(caller, run_id="run-a")
    warm(caller, connection, runId="run-a")
    assert outcome(caller, connection, runId="run-b") == "policy_denied"
    assert outcome(caller, connection) == "policy_denied"  # a minted run id
    assert outcome(caller, connection, runId="run-a") == "granted"


def test_a_grant_to_anyone_in_a_run_reaches_no_other_run_or_tenant(caller: Agent) -> None:
    colleague = make_agent(caller.tenant.slug, "agent:colleague")
    connection = make_connection(caller.tenant)
    permit_use(connection)
    grant(connection, principal="", run_id="run-shared")
    for who in (caller, colleague):
        warm(who, connection, runId="run-shared")
        assert outcome(who, connection, runId="run-other") == "policy_denied"
    intruder = make_agent("globex", caller.principal)
    allow(intruder.tenant, HTTP, name="http")
    assert outcome(intruder, connection, runId="run-shared") == "policy_denied"


def test_a_run_grant_added_while_the_standing_answer_is_cached_holds_at_once(
    caller: Agent,
) -> None:
    """The tenant had no run grants (so none were asked per run): the first one counts."""
    connection = make_connection(caller.tenant)
    permit_use(connection)
    for _ in range(2):
        assert outcome(caller, connection, runId="run-new") == "policy_denied"
    grant(connection, caller.principal, run_id="run-new")
    assert outcome(caller, connection, runId="run-new") == "granted"
    assert outcome(caller, connection, runId="run-old") == "policy_denied"


def test_the_run_cache_stays_bounded(caller: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epoch, "MAX_ENTRIES", 5)
    connection, _ = usable_connection(caller, run_id="run-0")
    with epoch.pinned():
        for n in range(12):
            assert grants.may_use(caller.tenant, caller.principal, f"run-{n}", connection.pk) is (
                n == 0
            )
        assert len(grants._RUN._entries) <= 5


# ---------------------------------------------------------------- the listing


def test_the_connection_list_follows_grants_at_once(caller: Agent) -> None:
    connection, the_grant = usable_connection(caller)

    def listed() -> list[str]:
        response = caller.client.get("/api/v1/connections/")
        return [c["id"] for c in response.json()["connections"]]

    assert listed() == listed() == [str(connection.pk)]
    Grant.objects.filter(pk=the_grant.pk).update(revoked_at=timezone.now())
    assert listed() == []


# ---------------------------------------------------------------- what a warm call costs


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server(keep_alive=True) as running:
        yield running


def test_a_warm_http_call_reads_neither_a_grant_nor_the_connection(
    caller: Agent, server: LocalServer
) -> None:
    connection = make_connection(caller.tenant, hosts=("127.0.0.1",), private=True)
    permit_use(connection)
    grant(connection, caller.principal)

    def call() -> Any:
        args = {"url": f"{server.base}/ok"}
        return caller.invoke(HTTP, args=args, connectionId=str(connection.pk), runId="run-q")

    ok_result(call())
    with CaptureQueriesContext(db) as queries:
        ok_result(call())
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in sql if "connections_grant" in s], sql
    # Step 9 binds the row cached under the epoch; step 10b scrubs with what was bound.
    assert not [s for s in sql if "connections_connection" in s], sql
