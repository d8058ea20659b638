"""One service user per (tenant, principal), never shared (issue 42).

A principal may have 153 characters; with the tenant's slug its service username would
exceed Django's 150, and names used to be cut there: the slug fell off and two tenants'
keys shared one user, with each other's group and object permissions.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from guardian.shortcuts import assign_perm

from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import (
    USERNAME_MAX,
    UnmappablePrincipal,
    agents_group,
    service_username,
)
from apps.tenants.roles import Role, grant_role
from apps.tools.models import Tool
from apps.tools.permissions import can_execute

pytestmark = pytest.mark.django_db

LONGEST = f"{'k' * 32}:{'n' * 120}"  # PRINCIPAL_RE's limit: 153 characters


@pytest.fixture
def tenants(db: None) -> tuple[Tenant, Tenant]:
    return Tenant.objects.create(slug="acme"), Tenant.objects.create(slug="globex")


def test_a_principal_at_the_length_limit_gets_its_own_user_in_each_tenant(tenants):
    acme, globex = tenants
    acme_key, _ = ApiKey.objects.issue(acme, LONGEST)
    globex_key, _ = ApiKey.objects.issue(globex, LONGEST)
    assert acme_key.user != globex_key.user
    for key, tenant in ((acme_key, acme), (globex_key, globex)):
        assert len(key.user.username) <= USERNAME_MAX
        assert key.user.username.endswith(f"@{tenant.slug}")
        assert list(key.user.groups.all()) == [agents_group(tenant)]
        assert not key.user.has_usable_password()
    # acme's grants reach acme's agent only.
    tool = Tool.objects.get(pk="core__get_current_time")
    assign_perm("tools.execute_tool", agents_group(acme), tool)
    assert can_execute(User.objects.get(pk=acme_key.user.pk), tool)
    assert not can_execute(User.objects.get(pk=globex_key.user.pk), tool)
    # A second key of the same pair shares the pair's user, and only that.
    again, _ = ApiKey.objects.issue(acme, LONGEST)
    assert again.user == acme_key.user


def test_long_principals_that_differ_only_at_the_end_do_not_share(tenants):
    acme, _ = tenants
    first, _ = ApiKey.objects.issue(acme, LONGEST)
    second, _ = ApiKey.objects.issue(acme, LONGEST[:-1] + "m")
    assert first.user != second.user


def test_short_names_keep_their_readable_form(tenants):
    acme, _ = tenants
    assert service_username(acme, "agent:support-bot") == "agent+support-bot@acme"


def test_a_name_held_by_a_person_is_refused_clearly(tenants):
    acme, _ = tenants
    User.objects.create_user("agent+bot@acme", password="pw-a-person-123")
    with pytest.raises(UnmappablePrincipal, match="cannot be mapped safely"):
        ApiKey.objects.issue(acme, "agent:bot")
    assert not ApiKey.objects.exists()


def test_a_service_user_of_another_tenant_is_never_reused(tenants):
    """Even if a name already maps to a user in another tenant's agents group."""
    acme, globex = tenants
    key, _ = ApiKey.objects.issue(acme, "agent:bot")
    key.user.groups.add(agents_group(globex))  # as the old cut names did
    with pytest.raises(UnmappablePrincipal, match="another tenant's agent"):
        ApiKey.objects.issue(acme, "agent:bot")


def test_the_admin_form_says_why_a_principal_cannot_be_mapped(tenants):
    acme, _ = tenants
    User.objects.create_user("agent+bot@acme", password="pw-a-person-123")
    admin = User.objects.create_user("ada", password="pw-ada-123456")
    grant_role(admin, acme, Role.ADMIN)
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/tenants/apikey/add/", {"tenant": acme.pk, "principal": "agent:bot", "name": ""}
    )
    assert response.status_code == 200
    assert "cannot be mapped safely" in response.content.decode()
    assert not ApiKey.objects.exists()
