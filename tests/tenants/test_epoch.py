"""The authorization epoch (apps/tenants/epoch.py): every edit that can change who may do
what gives it a new value, so the per-process caches of the call path never answer from
before the edit; things that change nothing leave it alone (issue 13)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from apps.approvals.models import Vote
from apps.connections.models import Connection, Grant
from apps.policies.models import Policy, PolicyRule
from apps.tenants import epoch
from apps.tenants.models import ApiKey, AuthzEpoch, Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from tests.conftest import Agent

TOOL = "core__get_current_time"


def service_user(agent: Agent) -> User:
    return ApiKey.objects.get(tenant=agent.tenant, principal=agent.principal).user


def tool() -> Tool:
    return Tool.objects.get(pk=TOOL)


def policy(agent: Agent) -> Policy:
    return Policy.objects.get(tenant=agent.tenant)


def execute() -> Permission:
    return Permission.objects.get(codename="execute_tool")


def add_rule(agent: Agent) -> PolicyRule:
    return PolicyRule.objects.create(policy=policy(agent), tool_pattern=TOOL, condition="true")


def deactivate(agent: Agent) -> None:
    user = service_user(agent)
    user.is_active = False
    user.save()


EDITS: dict[str, Callable[[Agent], Any]] = {
    "a tool saved": lambda a: tool().save(),
    "tools disabled in bulk": lambda a: Tool.objects.filter(pk=TOOL).update(enabled=False),
    "a policy saved": lambda a: policy(a).save(),
    "policies disabled in bulk": lambda a: Policy.objects.update(enabled=False),
    "a policy deleted": lambda a: policy(a).delete(),
    "a rule added": add_rule,
    "a rule deleted": lambda a: PolicyRule.objects.filter(pk=add_rule(a).pk).delete(),
    "a tool unlisted": lambda a: policy(a).tools.remove(tool()),
    "a policy's tools cleared": lambda a: policy(a).tools.clear(),
    "execute_tool revoked from a group": lambda a: remove_perm(
        "tools.execute_tool", agents_group(a.tenant), tool()
    ),
    "execute_tool granted to a user": lambda a: assign_perm(
        "tools.execute_tool", service_user(a), tool()
    ),
    "a global permission granted": lambda a: service_user(a).user_permissions.add(execute()),
    "a group's permissions changed": lambda a: agents_group(a.tenant).permissions.add(execute()),
    "a user left a group": lambda a: service_user(a).groups.remove(agents_group(a.tenant)),
    "a user joined a group": lambda a: service_user(a).groups.add(Group.objects.create(name="x")),
    "a user deactivated": deactivate,
    "a group deleted": lambda a: agents_group(a.tenant).delete(),
    "a key revoked": lambda a: ApiKey.objects.get(tenant=a.tenant).revoke(),
    "a key issued": lambda a: ApiKey.objects.issue(a.tenant, "agent:second"),
    "a tenant saved": lambda a: Tenant.objects.get(pk=a.tenant.pk).save(),
    # Bulk writes send no signals: each of these models' querysets bumps itself.
    "keys revoked in bulk": lambda a: ApiKey.objects.filter(tenant=a.tenant).update(
        revoked_at=timezone.now()
    ),
    "users deactivated in bulk": lambda a: User.objects.filter(pk=service_user(a).pk).update(
        is_active=False
    ),
    "a tenant renamed in bulk": lambda a: Tenant.objects.filter(pk=a.tenant.pk).update(name="n"),
    "groups renamed in bulk": lambda a: Group.objects.filter(pk=agents_group(a.tenant).pk).update(
        name="renamed"
    ),
    "users updated in bulk_update": lambda a: User.objects.bulk_update(
        [service_user(a)], ["is_staff"]
    ),
    # (A permission the agent does not hold yet: guardian skips those already held.)
    "a permission granted on a list of tools": lambda a: assign_perm(
        "tools.change_tool",
        service_user(a),
        [tool()],  # type: ignore[arg-type]  # guardian's stubs name one object; lists work
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_it_changes_the_epoch_on_every_edit_that_can_change_an_answer(
    agent: Agent, edit: str
) -> None:
    before = epoch.read()
    EDITS[edit](agent)
    assert epoch.read() != before


def a_grant(agent: Agent) -> Grant:
    connection = Connection(tenant=agent.tenant, name="svc", kind="bearer")
    connection.set_secret(token="token-of-svc-0123")
    connection.allowed_hosts = ["api.example.com"]
    connection.save()
    return Grant.objects.create(tenant=agent.tenant, connection=connection, principal="agent:a")


GRANT_WRITES: dict[str, Callable[[Grant], Any]] = {
    "a grant created": lambda g: Grant.objects.create(
        tenant=g.tenant, connection=g.connection, principal="agent:b"
    ),
    "grants created in bulk": lambda g: Grant.objects.bulk_create(
        [Grant(tenant=g.tenant, connection=g.connection, principal="agent:b")]
    ),
    "a grant revoked": lambda g: g.revoke(),
    "grants revoked in bulk": lambda g: Grant.objects.filter(pk=g.pk).update(
        revoked_at=timezone.now()
    ),
    "a grant's expiry moved in bulk": lambda g: Grant.objects.filter(pk=g.pk).update(
        expires_at=timezone.now()
    ),
    "a grant deleted": lambda g: g.delete(),
    # QuerySet.delete() takes no fast path while a post_delete receiver is connected:
    # every row is signalled, so this bumps without an EpochQuerySet.delete.
    "grants deleted in bulk": lambda g: Grant.objects.filter(tenant=g.tenant).delete(),
    "a connection saved": lambda g: g.connection.save(),
    "connections updated in bulk": lambda g: Connection.objects.filter(pk=g.connection_id).update(
        allow_private_network=True
    ),
    "a connection deleted (its grants by cascade)": lambda g: g.connection.delete(),
    "connections deleted in bulk": lambda g: Connection.objects.filter(pk=g.connection_id).delete(),
}


@pytest.mark.django_db
@pytest.mark.parametrize("write", sorted(GRANT_WRITES))
def test_it_changes_the_epoch_on_every_grant_and_connection_write(agent: Agent, write: str) -> None:
    """The runner's step 4 caches grants under the epoch (apps/connections/grants.py)."""
    the_grant = a_grant(agent)
    before = epoch.read()
    GRANT_WRITES[write](the_grant)
    assert epoch.read() != before


@pytest.mark.django_db
def test_a_secret_re_encrypted_changes_the_epoch(agent: Agent) -> None:
    """Connection rows, ciphertext included, are cached under the epoch (the broker)."""
    connection = a_grant(agent).connection
    before = epoch.read()
    Grant.objects.filter(principal="nobody").update(revoked_at=timezone.now())  # no row
    assert epoch.read() == before
    connection.set_secret(token="token-rotated-0123")
    connection.save(update_fields=["secret_encrypted"])  # as rotate_connection_keys does
    assert epoch.read() != before


@pytest.mark.django_db
def test_it_leaves_the_epoch_alone_for_a_call_a_login_and_a_keys_use(agent: Agent) -> None:
    assert agent.invoke(TOOL).json()["ok"] is True
    before = epoch.read()
    assert agent.invoke(TOOL).json()["ok"] is True  # records and events change nothing
    user = service_user(agent)
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])
    ApiKey.objects.get(tenant=agent.tenant).touch()
    ApiKey.objects.filter(tenant=agent.tenant).update(last_used_at=timezone.now())
    User.objects.filter(pk=user.pk).update(last_login=timezone.now())
    Tool.objects.filter(pk=TOOL, enabled=False).update(enabled=True)  # no row changed
    assert epoch.read() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("edit", "answer"),
    [
        ("tools disabled in bulk", "unavailable"),
        ("a policy deleted", "policy_denied"),
        ("policies disabled in bulk", "policy_denied"),
        ("a tool unlisted", "policy_denied"),
        ("execute_tool revoked from a group", "authz_denied"),
        ("a user left a group", "authz_denied"),
        ("a key revoked", 401),
        ("a user deactivated", "authz_denied"),
        ("keys revoked in bulk", 401),
        ("users deactivated in bulk", "authz_denied"),
    ],
)
def test_the_next_call_in_this_process_sees_the_edit(
    agent: Agent, edit: str, answer: str | int
) -> None:
    """The caches are warm (two calls before), and the edit still holds at once."""
    for _ in range(2):
        assert agent.invoke(TOOL).json()["ok"] is True
    EDITS[edit](agent)
    response = agent.invoke(TOOL)
    if isinstance(answer, int):
        assert response.status_code == answer
    else:
        assert response.json()["errorCode"] == answer


@pytest.mark.django_db
def test_a_permission_granted_to_many_groups_changes_the_epoch(agent: Agent) -> None:
    """guardian's assign_perm() on a list of groups is one bulk_create()."""
    groups = [Group.objects.create(name="g1"), Group.objects.create(name="g2")]
    before = epoch.read()
    assign_perm("tools.execute_tool", groups, tool())
    assert epoch.read() != before


@pytest.mark.django_db
def test_rules_changed_in_bulk_hold_on_the_next_call(agent: Agent) -> None:
    rule = PolicyRule.objects.create(
        policy=policy(agent), tool_pattern=TOOL, condition="true", outcome="allow"
    )
    assert agent.invoke(TOOL).json()["ok"] is True
    before = epoch.read()
    PolicyRule.objects.filter(pk=rule.pk).update(outcome="deny")
    assert epoch.read() != before
    assert agent.invoke(TOOL).json()["errorCode"] == "policy_denied"


@pytest.mark.django_db
def test_the_querysets_that_bump_keep_their_own_methods(agent: Agent) -> None:
    """The epoch's queryset is mixed into auth's and guardian's, not put in their place."""
    assert isinstance(User.objects.all(), epoch.EpochQuerySet)
    assert User.objects.get_by_natural_key(service_user(agent).username) == service_user(agent)
    group = agents_group(agent.tenant)
    assert isinstance(group.user_set.all(), epoch.EpochQuerySet)
    assert ApiKey.objects.get_queryset().active().filter(tenant=agent.tenant).count() == 1
    before = epoch.read()
    group.user_set.update(is_active=False)  # a related manager's bulk write
    assert epoch.read() != before


def test_a_model_on_the_shared_manager_must_declare_its_own() -> None:
    """Mixing into Django's plain Manager would reach every model: refused at start-up."""
    with pytest.raises(ImproperlyConfigured, match="give it an EpochQuerySet manager"):
        epoch._bulk_writes_bump(Vote)


@pytest.mark.django_db
def test_a_deny_rule_added_holds_on_the_next_call(agent: Agent) -> None:
    assert agent.invoke(TOOL).json()["ok"] is True
    rule = add_rule(agent)
    rule.outcome = "deny"
    rule.save()
    assert agent.invoke(TOOL).json()["errorCode"] == "policy_denied"


@pytest.mark.django_db
def test_a_warm_call_reads_the_epoch_once_and_no_authorization_rows(agent: Agent) -> None:
    agent.invoke(TOOL)
    with CaptureQueriesContext(connection) as queries:
        assert agent.invoke(TOOL).json()["ok"] is True
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert len(reads) == 1 and "tenants_authzepoch" in reads[0], reads


@pytest.mark.django_db
def test_it_recreates_a_lost_epoch_row_with_a_value_never_cached_under(agent: Agent) -> None:
    """A flushed table (tests) or a restored backup must not bring back an old value."""
    agent.invoke(TOOL)
    cached_at = epoch.read()
    AuthzEpoch.objects.all().delete()
    assert epoch.read() != cached_at
    assert agent.invoke(TOOL).json()["ok"] is True


@pytest.mark.django_db
def test_a_scope_sees_its_own_edit(agent: Agent) -> None:
    with epoch.pinned():
        first = epoch.current()
        assert epoch.current() == first  # read once
        Tool.objects.filter(pk=TOOL).update(enabled=False)
        assert epoch.current() != first
        assert Tool.objects.current(TOOL).enabled is False  # type: ignore[union-attr]


def test_a_cache_never_returns_an_answer_loaded_at_another_epoch() -> None:
    cache = epoch.EpochCache("test")
    values = iter([1, 1, 2])
    token = epoch._pinned.set([None])
    try:
        loads: list[int] = []

        def load() -> int:
            loads.append(1)
            return len(loads)

        for expected in (1, 1, 2):
            epoch._pinned.get()[0] = next(values)  # type: ignore[index]
            assert cache.get("k", load) == expected
    finally:
        epoch._pinned.reset(token)
    assert len(loads) == 2


def test_a_cache_is_safe_to_share_between_threads() -> None:
    cache = epoch.EpochCache("threads")
    errors: list[BaseException] = []

    def ask(n: int) -> None:
        token = epoch._pinned.set([n % 3])
        try:
            for i in range(300):
                key = (n % 3, i % 7)
                assert cache.get(key, lambda key=key: key) == key  # type: ignore[misc]
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            epoch._pinned.reset(token)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
