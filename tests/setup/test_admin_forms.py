"""Forms that explain themselves: connections, policies and their rules, tools, tenants."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.connections.models import Connection
from apps.policies.models import Policy, PolicyRule
from apps.tools.models import Tool
from tests.setup.conftest import Setting, logged_in

TIME = "core__get_current_time"
CONNECTION_ADD = "/admin/connections/connection/add/"


@pytest.fixture
def root(setting: Setting) -> Client:
    return logged_in(User.objects.create_superuser("root", password="pw-root-123456"))


def add_connection(client: Client, setting: Setting, **fields: Any) -> Any:
    data = {
        "tenant": setting.agent.tenant.pk,
        "name": "github",
        "kind": "bearer",
        "allowed_hosts": "api.github.com\n*.githubusercontent.com",
        "token": "SECRET-token-forms-1234",
        **fields,
    }
    return client.post(CONNECTION_ADD, data)


# ---------------------------------------------------------------- connections


def test_the_connection_add_page_shows_no_id_that_the_save_would_not_use(setting, admin_client):
    page = admin_client.get(CONNECTION_ADD).content.decode()
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", page)
    assert "connection_form.js" in page
    response = add_connection(admin_client, setting)
    assert response.status_code == 302
    saved = Connection.objects.get(name="github")
    page = admin_client.get(f"/admin/connections/connection/{saved.pk}/change/").content.decode()
    assert str(saved.pk) in page


def test_allowed_hosts_are_a_list_one_per_line(setting, admin_client):
    add_connection(admin_client, setting)
    connection = Connection.objects.get(name="github")
    assert connection.allowed_hosts == ["api.github.com", "*.githubusercontent.com"]
    page = admin_client.get(f"/admin/connections/connection/{connection.pk}/change/")
    assert "api.github.com\n*.githubusercontent.com" in page.content.decode()


@pytest.mark.parametrize(
    "hosts", ["https://api.github.com/", "api.github.com:443", "api.github.com/path", "", "a b"]
)
def test_hosts_that_are_not_host_names_are_refused_with_a_reason(setting, admin_client, hosts):
    response = add_connection(admin_client, setting, allowed_hosts=hosts)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "allowed_hosts" in errors
    assert not Connection.objects.filter(name="github").exists()


def test_only_the_chosen_kinds_credential_fields_are_stored(setting, admin_client):
    add_connection(admin_client, setting, password="SECRET-other-kind-5678", username="x")
    assert Connection.objects.get(name="github").read_secret() == {
        "token": "SECRET-token-forms-1234"
    }


def test_changing_the_kind_needs_the_new_kinds_credentials(setting, admin_client):
    add_connection(admin_client, setting)
    connection = Connection.objects.get(name="github")
    url = f"/admin/connections/connection/{connection.pk}/change/"
    data = {
        "tenant": setting.agent.tenant.pk,
        "name": "github",
        "kind": "basic",
        "allowed_hosts": "api.github.com",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "needs username, password" in response.content.decode()
    connection.refresh_from_db()
    assert connection.kind == "bearer"


# ---------------------------------------------------------------- policies


def test_a_rule_whose_cel_does_not_compile_is_refused_on_the_page(setting, admin_client):
    policy = Policy.objects.create(tenant=setting.agent.tenant, name="p")
    url = f"/admin/policies/policy/{policy.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "has(args.field)" in page and "Position" in page  # the CEL help and position
    data = {
        "tenant": setting.agent.tenant.pk,
        "name": "p",
        "enabled": "on",
        "approval_timeout_minutes": 15,
        "high_consequence_quorum": 1,
        "rules-TOTAL_FORMS": 1,
        "rules-INITIAL_FORMS": 0,
        "rules-0-position": 0,
        "rules-0-tool_pattern": "*",
        "rules-0-condition": "args.amount >",
        "rules-0-outcome": "deny",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "does not compile" in response.content.decode()
    assert not PolicyRule.objects.exists()


def test_bulk_policy_actions_never_reach_another_tenants_policy(setting, admin_client):
    own = Policy.objects.create(tenant=setting.agent.tenant, name="own")
    foreign = Policy.objects.create(tenant=setting.stranger.tenant, name="foreign")
    response = admin_client.post(
        "/admin/policies/policy/",
        {"action": "disable_policies", "_selected_action": [own.pk, foreign.pk]},
    )
    assert response.status_code == 302
    own.refresh_from_db()
    foreign.refresh_from_db()
    assert own.enabled is False
    assert foreign.enabled is True


# ---------------------------------------------------------------- tools


def test_the_tool_list_shows_enabled_next_to_the_id(setting, root):
    page = root.get("/admin/tools/tool/").content.decode()
    headers = re.findall(r'<th scope="col" class="[^"]*column-([a-z_]+)', page)
    assert headers[:2] == ["id", "enabled"]


def test_a_superuser_switches_tools_in_bulk(setting, root):
    response = root.post(
        "/admin/tools/tool/", {"action": "disable_tools", "_selected_action": [TIME]}
    )
    assert response.status_code == 302
    assert Tool.objects.get(pk=TIME).enabled is False
    root.post("/admin/tools/tool/", {"action": "enable_tools", "_selected_action": [TIME]})
    assert Tool.objects.get(pk=TIME).enabled is True


def test_a_tenant_admin_cannot_switch_tools_in_bulk(setting, admin_client):
    page = admin_client.get("/admin/tools/tool/").content.decode()
    assert "disable_tools" not in page
    admin_client.post("/admin/tools/tool/", {"action": "disable_tools", "_selected_action": [TIME]})
    assert Tool.objects.get(pk=TIME).enabled is True


def test_a_tool_defined_in_code_cannot_be_deleted(setting, root):
    assert root.get(f"/admin/tools/tool/{TIME}/delete/").status_code == 403
    page = root.get("/admin/tools/tool/").content.decode()
    assert "delete_selected" not in page


def test_the_tool_page_lists_the_policies_of_your_tenants_that_use_it(setting, admin_client):
    Policy.objects.create(tenant=setting.agent.tenant, name="by pattern", tool_patterns="core__*")
    Policy.objects.create(tenant=setting.stranger.tenant, name="globex secret plan").tools.add(
        Tool.objects.get(pk=TIME)
    )
    Policy.objects.create(tenant=setting.agent.tenant, name="unrelated", tool_patterns="mcp__*")
    page = admin_client.get(f"/admin/tools/tool/{TIME}/change/").content.decode()
    section = page[page.index('id="used-by-policies"') :]
    assert "acme/by pattern" in section
    assert "globex" not in section and "unrelated" not in section


# ---------------------------------------------------------------- tenants


def test_the_member_picker_offers_people_only(setting, root):
    setting.agent.client.get("/api/v1/tools/")  # the agent's service user exists
    page = root.get(f"/admin/tenants/tenant/{setting.agent.tenant.pk}/change/").content.decode()
    members = page[page.index('name="memberships-__prefix__-user"') :]
    members = members[: members.index("</select>")]
    assert "ada" in members
    assert "AnonymousUser" not in members
    assert "agent+demo@acme" not in members
