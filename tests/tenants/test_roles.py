"""Roles per tenant (issue 42): every check asks the role in the tenant of the object.

Dana is a tenant admin of acme and an operator of globex. In globex she sees and decides
approvals and nothing else; in acme she does everything a tenant admin does. A staff
user in no tenant sees nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from apps.approvals.models import ApprovalRequest
from apps.connections.models import Connection, Grant
from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Membership, Role, Tenant
from apps.tenants.roles import grant_role, may
from tests.approvals.support import TEST_TOOLS, hold, logged_in, post_decision
from tests.conftest import Agent, allow

pytestmark = pytest.mark.django_db


def make_connection(tenant: Tenant) -> Connection:
    connection = Connection(tenant=tenant, name=f"{tenant.slug}-crm", kind="bearer")
    connection.allowed_hosts = [f"api.{tenant.slug}.example"]
    connection.set_secret(token="secret-token")
    connection.save()
    return connection


@pytest.fixture
def world(agent: Agent, stranger: Agent, test_tools: list[str]) -> dict[str, Any]:
    """acme (agent) and globex (stranger), each with a policy, a connection, a grant, a
    key and a held call; dana: admin of acme, operator of globex."""
    rows: dict[str, Any] = {}
    for name, each in (("acme", agent), ("globex", stranger)):
        allow(each.tenant, *TEST_TOOLS, name="test tools")
        connection = make_connection(each.tenant)
        rows[name] = {
            "agent": each,
            "policy": Policy.objects.get(tenant=each.tenant, name="test tools"),
            "connection": connection,
            "grant": Grant.objects.create(
                tenant=each.tenant, connection=connection, principal=each.principal
            ),
            "key": ApiKey.objects.get(tenant=each.tenant),
            "approval": hold(each, "test__confirm", args={})[1],
        }
    dana = User.objects.create_user("dana", password="pw-dana-12345")
    grant_role(dana, agent.tenant, Role.ADMIN)
    grant_role(dana, stranger.tenant, Role.OPERATOR)
    rows["dana"] = dana
    return rows


def admin_url(obj: Any, page: str = "change") -> str:
    meta = obj._meta
    return f"/admin/{meta.app_label}/{meta.model_name}/{obj.pk}/{page}/"


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


CONFIGURATION = ("policy", "connection", "grant", "key")


@pytest.mark.parametrize("row", CONFIGURATION)
def test_an_operator_of_globex_cannot_see_or_change_its_configuration(world, row):
    client = browser(world["dana"])
    foreign = world["globex"][row]
    page = client.get(admin_url(foreign))
    assert page.status_code == 302 and page.url == "/admin/"  # "does not exist" in scope
    listing = client.get(f"/admin/{foreign._meta.app_label}/{foreign._meta.model_name}/")
    assert listing.status_code == 200
    assert foreign not in listing.context["cl"].queryset
    assert world["acme"][row] in listing.context["cl"].queryset
    deleting = client.post(admin_url(foreign, "delete"), {"post": "yes"})
    assert deleting.status_code == 302 and deleting.url == "/admin/"
    assert type(foreign).objects.filter(pk=foreign.pk).exists()
    assert not may(world["dana"], f"{foreign._meta.app_label}.change_{foreign._meta.model_name}",
                   foreign)  # fmt: skip


@pytest.mark.parametrize("row", CONFIGURATION)
def test_a_tenant_admin_of_acme_sees_and_changes_its_configuration(world, row):
    client = browser(world["dana"])
    own = world["acme"][row]
    assert client.get(admin_url(own)).status_code == 200
    assert world["dana"].has_perm(f"{own._meta.app_label}.change_{own._meta.model_name}", own)


def test_a_forged_post_cannot_add_a_policy_to_the_tenant_where_she_is_an_operator(world):
    client = browser(world["dana"])
    globex = world["globex"]["agent"].tenant
    response = client.post(
        "/admin/policies/policy/add/",
        {"tenant": globex.pk, "name": "sneaky", "enabled": "on", "_save": "1",
         "rules-TOTAL_FORMS": "0", "rules-INITIAL_FORMS": "0"},
    )  # fmt: skip
    assert response.status_code == 200  # the form again, with its error
    assert not Policy.objects.filter(name="sneaky").exists()


def test_approvals_of_both_tenants_are_seen_and_decided(world):
    client = browser(world["dana"])
    for name in ("acme", "globex"):
        approval = world[name]["approval"]
        assert client.get(admin_url(approval)).status_code == 200
        assert client.get(f"/console/approvals/{approval.pk}/").status_code == 200
    api = logged_in(world["dana"])
    listed = {row["approvalId"] for row in api.get("/api/v1/approvals/").json()["results"]}
    assert listed == {str(world[name]["approval"].pk) for name in ("acme", "globex")}
    for name in ("acme", "globex"):
        response = post_decision(api, world[name]["approval"].pk, "reject", reason="no")
        assert response.status_code == 200, response.content
        assert ApprovalRequest.objects.get(pk=world[name]["approval"].pk).status == "rejected"


def test_the_dry_run_on_behalf_of_a_principal_is_a_tenant_admins(world):
    api = logged_in(world["dana"])
    body = {"toolId": "test__echo", "args": {"text": "hi"}}
    own = api.post(
        "/api/v1/simulations/",
        {**body, "tenant": "acme", "principal": world["acme"]["agent"].principal},
        format="json",
    )
    assert own.status_code == 200, own.content
    foreign = api.post(
        "/api/v1/simulations/",
        {**body, "tenant": "globex", "principal": world["globex"]["agent"].principal},
        format="json",
    )
    assert foreign.status_code == 403
    assert "does not allow asking on behalf" in foreign.content.decode()


def test_the_setup_page_offers_only_the_tenants_where_she_is_an_admin(world):
    client = browser(world["dana"])
    page = client.get("/admin/policies/policy/setup/")
    assert page.status_code == 200
    choices = page.context["form"].fields["tenant"].queryset
    assert list(choices) == [world["acme"]["agent"].tenant]
    operator = User.objects.create_user("otto", password="pw-otto-12345")
    grant_role(operator, world["globex"]["agent"].tenant, Role.OPERATOR)
    assert browser(operator).get("/admin/policies/policy/setup/").status_code == 403


def test_a_global_role_permission_counts_for_nothing(world):
    """A superuser's global grant of a role permission does not reach across tenants."""
    dana = world["dana"]
    dana.user_permissions.add(Permission.objects.get(codename="change_policy"))
    dana = User.objects.get(pk=dana.pk)
    assert not dana.has_perm("policies.change_policy", world["globex"]["policy"])
    assert dana.has_perm("policies.change_policy", world["acme"]["policy"])


def test_a_staff_user_in_no_tenant_sees_nothing(world):
    loner = User.objects.create_user("loner", password="pw-loner-12345", is_staff=True)
    client = browser(loner)
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "have permission to view or edit anything" in index.content.decode()
    for name in ("acme", "globex"):
        for row in (*CONFIGURATION, "approval"):
            assert client.get(admin_url(world[name][row])).status_code in (302, 403)
        assert client.get(f"/console/approvals/{world[name]['approval'].pk}/").status_code in (
            404, 200,
        )  # fmt: skip
    queue = client.get("/console/")
    assert str(world["acme"]["approval"].pk) not in queue.content.decode()
    api = logged_in(loner)
    assert api.get("/api/v1/approvals/").json()["results"] == []
    refused = api.post(
        "/api/v1/simulations/",
        {"toolId": "test__echo", "args": {}, "tenant": "acme", "principal": "agent:test"},
        format="json",
    )
    assert refused.status_code == 403
    assert "not a member of tenant 'acme'" in refused.content.decode()


def test_roles_are_per_tenant_and_regranting_replaces_only_that_tenants(world):
    dana = world["dana"]
    acme, globex = world["acme"]["agent"].tenant, world["globex"]["agent"].tenant
    grant_role(dana, globex, Role.ADMIN)
    assert Membership.objects.get(user=dana, tenant=globex).role == Role.ADMIN
    grant_role(dana, acme, Role.OPERATOR)
    assert Membership.objects.get(user=dana, tenant=acme).role == Role.OPERATOR
    assert not dana.has_perm("policies.change_policy", world["acme"]["policy"])
    assert dana.has_perm("policies.change_policy", world["globex"]["policy"])


def test_the_tool_page_lists_only_the_policies_her_role_shows(world):
    page = browser(world["dana"]).get("/admin/tools/tool/test__confirm/change/")
    assert page.status_code == 200
    used = page.context["used_by_policies"]
    assert world["acme"]["policy"] in used
    assert world["globex"]["policy"] not in used
