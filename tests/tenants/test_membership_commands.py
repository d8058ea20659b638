"""create_staff --role and add_membership: a role in one tenant, said out loud."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.tenants.models import ApiKey, Membership, Role, Tenant

pytestmark = pytest.mark.django_db
PASSWORD = "Correct-Horse-93-battery"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def tenants(db: None) -> tuple[Tenant, Tenant]:
    return Tenant.objects.create(slug="acme"), Tenant.objects.create(slug="globex")


def role(username: str, slug: str) -> str:
    return Membership.objects.get(user__username=username, tenant__slug=slug).role


def test_create_staff_makes_a_membership_with_the_role_and_no_global_permission(tenants):
    run("create_staff", "--tenant", "acme", "--username", "ada", "--password", PASSWORD,
        "--role", "admin")  # fmt: skip
    ada = User.objects.get(username="ada")
    assert role("ada", "acme") == Role.ADMIN
    assert not ada.user_permissions.exists()
    assert not Membership.objects.filter(user=ada, tenant__slug="globex").exists()


def test_add_membership_gives_an_existing_person_a_role_in_another_tenant(tenants):
    run("create_staff", "--tenant", "acme", "--username", "ada", "--password", PASSWORD,
        "--role", "admin")  # fmt: skip
    out = run("add_membership", "--tenant", "globex", "--username", "ada", "--role", "operator")
    assert "ada is now operator of tenant globex." in out
    assert role("ada", "acme") == Role.ADMIN and role("ada", "globex") == Role.OPERATOR
    out = run("add_membership", "--tenant", "globex", "--username", "ada", "--role", "admin")
    assert "(was operator)" in out
    assert role("ada", "globex") == Role.ADMIN


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "nope", "--username", "ada", "--role", "admin"], "No tenant 'nope'"),
        (["--tenant", "acme", "--username", "nobody", "--role", "admin"], "No user 'nobody'"),
        (["--tenant", "acme", "--username", "ada", "--role", "root"], "Unknown role 'root'"),
        (
            ["--tenant", "acme", "--username", "agent+bot@globex", "--role", "admin"],
            "service user",
        ),
    ],
)
def test_add_membership_refuses_bad_input_clearly(tenants, args, message):
    User.objects.create_user("ada", password=PASSWORD)
    ApiKey.objects.issue(tenants[1], "agent:bot")
    with pytest.raises(CommandError, match=message):
        run("add_membership", *args)
    assert not Membership.objects.exists()
