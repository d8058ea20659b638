"""create_staff: an operator or a tenant admin of one tenant, and clear refusals."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from apps.tenants.models import Tenant
from apps.tools.models import Tool
from apps.tools.permissions import can_decide

pytestmark = [pytest.mark.django_db, pytest.mark.one_leg]
PASSWORD = "Correct-Horse-93-battery"


def create_staff(*args: str) -> str:
    out = StringIO()
    call_command("create_staff", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def acme(db: None) -> Tenant:
    return Tenant.objects.create(slug="acme")


def test_it_creates_an_operator_who_decides_but_edits_nothing(acme: Tenant):
    out = create_staff("--tenant", "acme", "--username", "opal", "--password", PASSWORD)
    assert "opal created: operator of tenant acme" in out
    user = User.objects.get(username="opal")
    assert user.is_staff and not user.is_superuser and user.check_password(PASSWORD)
    assert list(user.tenants.all()) == [acme]
    assert can_decide(user, Tool.objects.get(pk="core__get_current_time"), acme)
    assert user.has_perm("invocations.view_invocationrecord")
    assert not user.has_perm("policies.change_policy")
    client = Client()
    client.force_login(user)
    assert client.get("/admin/policies/policy/").status_code == 403
    assert client.get("/admin/invocations/invocationrecord/").status_code == 200


def test_it_creates_a_tenant_admin_who_edits_the_tenants_configuration(acme: Tenant):
    create_staff("--tenant", "acme", "--username", "ada", "--password", PASSWORD, "--role", "admin")
    user = User.objects.get(username="ada")
    for perm in (
        "policies.change_policy",
        "policies.add_policyrule",
        "connections.delete_connection",
        "connections.add_grant",
        "tenants.add_apikey",
        "approvals.view_approvalrequest",
    ):
        assert user.has_perm(perm), perm
    assert not user.has_perm("invocations.delete_invocationrecord")
    assert not user.has_perm("auth.change_user")
    client = Client()
    client.force_login(user)
    assert client.get("/admin/policies/policy/add/").status_code == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "nope", "--username", "x", "--password", PASSWORD], "No tenant 'nope'"),
        (["--tenant", "acme", "--username", "x", "--password", ""], "too short"),
        (["--tenant", "acme", "--username", "x", "--password", "password"], "too common"),
        (["--tenant", "acme", "--username", "x", "--password", "12345678901"], "numeric"),
        (["--tenant", "acme", "--username", "bad name!", "--password", PASSWORD], "username"),
        (
            ["--tenant", "acme", "--username", "x", "--password", PASSWORD, "--role", "root"],
            "Unknown role 'root'; choose one of: operator, admin",
        ),
    ],
)
def test_it_refuses_bad_input_clearly(acme: Tenant, args: list[str], message: str):
    with pytest.raises(CommandError, match=message):
        create_staff(*args)
    assert not User.objects.filter(username__in=["x", "bad name!"]).exists()


def test_it_refuses_an_existing_username_and_leaves_it_alone(acme: Tenant):
    User.objects.create_user("taken")
    with pytest.raises(CommandError, match="'taken' already exists"):
        create_staff("--tenant", "acme", "--username", "taken", "--password", PASSWORD)
    user = User.objects.get(username="taken")
    assert not user.is_staff and not user.tenants.exists()


def test_the_demo_operator_has_the_operator_role(db: None, tmp_path):
    from apps.tenants.roles import OPERATOR_PERMISSIONS

    call_command("seed_demo", "--key-file", str(tmp_path / "key"), stdout=StringIO())
    operator = User.objects.get(username="operator")
    assert operator.tenants.filter(slug="demo").exists()
    assert all(operator.has_perm(perm) for perm in OPERATOR_PERMISSIONS)
    assert not operator.has_perm("policies.change_policy")


def test_an_email_address_is_where_approval_mail_goes(acme: Tenant):
    out = create_staff(
        "--tenant", "acme", "--username", "opal", "--password", PASSWORD,
        "--email", "opal@example.com",
    )  # fmt: skip
    assert "no approval notifications" not in out
    assert User.objects.get(username="opal").email == "opal@example.com"


def test_without_an_email_it_says_no_mail_will_come(acme: Tenant):
    out = create_staff("--tenant", "acme", "--username", "opal", "--password", PASSWORD)
    assert "No --email: this person gets no approval notifications" in out
    assert User.objects.get(username="opal").email == ""


def test_a_malformed_email_is_refused_and_nobody_is_created(acme: Tenant):
    with pytest.raises(CommandError, match="valid email address"):
        create_staff(
            "--tenant", "acme", "--username", "opal", "--password", PASSWORD,
            "--email", "opal at example",
        )  # fmt: skip
    assert not User.objects.filter(username="opal").exists()
