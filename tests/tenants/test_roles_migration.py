"""Migrations 0004 (global roles become per-tenant memberships) and 0005 (shared service
users split), run from the state before them on rows made then."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Q

from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Membership, Role, Tenant
from apps.tenants.principals import agents_group, service_username
from apps.tenants.roles import ROLE_GOVERNED, may

# The role permissions as of migration 0004: roles may grow later (a permission added to a
# role since then was nobody's global permission before 0004).
_THEN = importlib.import_module("apps.tenants.migrations.0004_membership_roles")
OPERATOR_PERMISSIONS, ADMIN_PERMISSIONS = sorted(_THEN.OPERATOR), sorted(_THEN.ADMIN)

# One leg: the subject is the migrations' Python over rows (the same ORM statements on
# both databases); each test migrates most apps back and forward (about 20 s).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]


@pytest.fixture
def at() -> Iterator[Any]:
    """`at(migration)` migrates tenants back to it and returns the apps of then; the
    test's end migrates everything forward again."""
    executor = MigrationExecutor(connection)

    def back_to(name: str) -> Any:
        target = [("tenants", name)]
        executor.migrate(target)
        guardian = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "guardian"]
        return executor.loader.project_state(target + guardian).apps

    yield back_to
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def forward() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def permissions(apps: Any, names: Any) -> list[Any]:
    query = Q(pk__in=[])
    for name in names:
        app_label, codename = name.split(".")
        query |= Q(content_type__app_label=app_label, codename=codename)
    return list(apps.get_model("auth", "Permission").objects.filter(query))


def test_existing_staff_keep_exactly_their_roles_per_tenant(at):
    old = at("0003_webhook_private_network")
    OldTenant, OldUser = old.get_model("tenants", "Tenant"), old.get_model("auth", "User")
    acme, globex = OldTenant.objects.create(slug="acme"), OldTenant.objects.create(slug="globex")
    ada = OldUser.objects.create(username="ada", is_staff=True)  # admin, in both
    ada.user_permissions.add(*permissions(old, ADMIN_PERMISSIONS))
    oscar = OldUser.objects.create(username="oscar", is_staff=True)  # operator of acme
    oscar.user_permissions.add(*permissions(old, OPERATOR_PERMISSIONS))
    gus = OldUser.objects.create(username="gus", is_staff=True)  # operator through a group
    deciders = old.get_model("auth", "Group").objects.create(name="deciders")
    deciders.permissions.add(*permissions(old, OPERATOR_PERMISSIONS))
    gus.groups.add(deciders)
    pat = OldUser.objects.create(username="pat", is_staff=True)  # operator and a bit
    pat.user_permissions.add(*permissions(old, [*OPERATOR_PERMISSIONS, "policies.change_policy"]))
    mia = OldUser.objects.create(username="mia", is_staff=True)  # a member, no permission
    root = OldUser.objects.create(username="root", is_staff=True, is_superuser=True)
    root.user_permissions.add(*permissions(old, ADMIN_PERMISSIONS))
    acme.members.add(ada, oscar, gus, pat, mia, root)
    globex.members.add(ada)

    forward()

    def role(username: str, slug: str) -> str:
        return Membership.objects.get(user__username=username, tenant__slug=slug).role

    assert role("ada", "acme") == role("ada", "globex") == Role.ADMIN
    assert role("oscar", "acme") == role("gus", "acme") == role("pat", "acme") == Role.OPERATOR
    assert role("mia", "acme") == Role.MEMBER
    assert Membership.objects.filter(user__username="oscar").count() == 1
    # Nobody keeps a global role permission (only superusers, who need none).
    governed = permissions(old, ADMIN_PERMISSIONS)
    holders = User.objects.filter(Q(user_permissions__in=[p.pk for p in governed]))
    assert set(holders.values_list("username", flat=True)) == {"root"}
    assert not User.objects.get(username="gus").get_group_permissions() & ROLE_GOVERNED
    # What each could do in each tenant is what they could do before, never more.
    acme_now, globex_now = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    acme_policy = Policy.objects.create(tenant=acme_now, name="p")
    globex_policy = Policy.objects.create(tenant=globex_now, name="p")
    ada_now = User.objects.get(username="ada")
    assert ada_now.has_perm("policies.change_policy", acme_policy)
    assert ada_now.has_perm("policies.change_policy", globex_policy)
    for name in ("oscar", "gus", "pat", "mia"):
        user = User.objects.get(username=name)
        assert not user.has_perm("policies.change_policy", acme_policy), name
        assert not user.has_perm("policies.change_policy", globex_policy), name
    oscar_now = User.objects.get(username="oscar")
    assert all(may(oscar_now, p, acme_now) for p in OPERATOR_PERMISSIONS)
    assert not any(may(oscar_now, p, globex_now) for p in OPERATOR_PERMISSIONS)
    assert not any(may(User.objects.get(username="mia"), p, acme_now) for p in ROLE_GOVERNED)


def test_service_users_shared_by_a_cut_name_are_split(at, capsys):
    old = at("0004_membership_roles")
    OldTenant, OldUser = old.get_model("tenants", "Tenant"), old.get_model("auth", "User")
    OldKey, OldGroup = old.get_model("tenants", "ApiKey"), old.get_model("auth", "Group")
    ObjectPermission = old.get_model("guardian", "UserObjectPermission")
    ContentType = old.get_model("contenttypes", "ContentType")
    acme, globex = OldTenant.objects.create(slug="acme"), OldTenant.objects.create(slug="globex")
    shared_principal = f"{'k' * 32}:{'n' * 120}"
    lonely_principal = f"{'l' * 32}:{'n' * 120}"
    execute = permissions(old, ["tools.execute_tool"])[0]
    tool_type = ContentType.objects.get(app_label="tools", model="tool")

    def cut_user(principal: str, *tenants: Any) -> Any:
        user = OldUser.objects.create(
            username=f"{principal.replace(':', '+', 1)}@{tenants[0].slug}"[:150], password="!"
        )
        for tenant in tenants:
            user.groups.add(OldGroup.objects.get_or_create(name=f"{tenant.slug}: agents")[0])
        ObjectPermission.objects.create(
            user=user, permission=execute, content_type=tool_type, object_pk="core__echo"
        )
        return user

    shared = cut_user(shared_principal, acme, globex)
    lonely = cut_user(lonely_principal, acme)
    for number, (tenant, principal, user) in enumerate(
        [(acme, shared_principal, shared), (globex, shared_principal, shared),
         (acme, lonely_principal, lonely)]
    ):  # fmt: skip
        OldKey.objects.create(
            tenant=tenant, principal=principal, user=user, prefix=f"p{number}", key_hash="x"
        )

    forward()

    keys = {(key.tenant.slug, key.principal): key for key in ApiKey.objects.all()}
    acme_now, globex_now = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    acme_shared, globex_shared = (
        keys[("acme", shared_principal)],
        keys[("globex", shared_principal)],
    )
    assert acme_shared.user != globex_shared.user
    assert acme_shared.user.username == service_username(acme_now, shared_principal)
    assert list(acme_shared.user.groups.all()) == [agents_group(acme_now)]
    assert list(globex_shared.user.groups.all()) == [agents_group(globex_now)]
    # A shared user's own grants could be either tenant's: not copied, and said so.
    assert not ObjectPermission.objects.filter(user_id=acme_shared.user.pk).exists()
    assert not ObjectPermission.objects.filter(user_id=globex_shared.user.pk).exists()
    said = capsys.readouterr().out
    assert f"{shared_principal} of tenant acme" in said
    assert f"{shared_principal} of tenant globex" in said
    assert lonely_principal not in said
    # A user one pair alone had: its grants were that pair's, and move with it.
    lonely_now = keys[("acme", lonely_principal)].user
    assert lonely_now.username == service_username(acme_now, lonely_principal)
    assert ObjectPermission.objects.filter(user_id=lonely_now.pk, object_pk="core__echo").exists()


def test_a_tenants_webhook_becomes_its_first_approval_webhook():
    """Migration approvals 0003 / tenants 0007: the one webhook field of a tenant moves to
    an ApprovalWebhook with the same URL, encrypted secret and private-network switch."""
    from apps.approvals.models import ApprovalWebhook
    from apps.connections import crypto

    executor = MigrationExecutor(connection)
    before = [
        ("approvals", "0002_redundant_indexes"),
        ("tenants", "0006_membership_redundant_index"),
    ]
    executor.migrate(before)
    executor.loader.build_graph()
    OldTenant = executor.loader.project_state(before).apps.get_model("tenants", "Tenant")
    OldTenant.objects.create(
        slug="acme",
        approval_webhook_url="http://10.0.0.5/hook",
        approval_webhook_secret=crypto.encrypt({"secret": "s3cret"}),
        webhook_private_network=True,
    )
    OldTenant.objects.create(slug="globex")  # no webhook: none made

    forward()

    (hook,) = ApprovalWebhook.objects.all()
    assert (hook.tenant.slug, hook.url, hook.format) == ("acme", "http://10.0.0.5/hook", "generic")
    assert hook.private_network is True and hook.signing_secret() == "s3cret"
    assert list(hook.rules.all()) == []  # every held call, as before
