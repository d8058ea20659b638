"""The setup page: one form creates every gate a call needs; and the page per principal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from guardian.models import UserObjectPermission

from apps.connections.models import Grant
from apps.policies import setup
from apps.policies.models import Policy, PolicyRule
from apps.policies.setup import grant_tool
from apps.tools.models import Tool
from tests.connections import HTTP, LocalServer, local_server
from tests.setup.conftest import (
    PRINCIPAL_URL,
    PRINCIPALS_URL,
    SETUP_URL,
    Setting,
    build_setting,
    logged_in,
)
from tests.support.responses import ok_result

TIME = "core__get_current_time"


def set_up(client: Any, setting: Setting, tool: str = HTTP, **fields: Any) -> Any:
    data = {
        "tenant": setting.agent.tenant.pk,
        "principal": setting.agent.principal,
        "tool": tool,
        "connection": setting.connection.pk if tool == HTTP else "",
        **fields,
    }
    return client.post(SETUP_URL, data)


def rows() -> dict[str, int]:
    return {
        "policies": Policy.objects.count(),
        "rules": PolicyRule.objects.count(),
        "grants": Grant.objects.count(),
        "perms": UserObjectPermission.objects.count(),
        "users": User.objects.count(),
    }


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


@pytest.mark.django_db(transaction=True)
def test_following_the_setup_page_lets_the_agent_really_call_http_request(server):
    setting = build_setting()
    agent = setting.agent
    url = f"{server.base}/ok/setup"
    before = agent.invoke(HTTP, args={"url": url}, connectionId=str(setting.connection.pk))
    assert before.json()["errorCode"] == "policy_denied"
    response = set_up(logged_in(setting.admin), setting)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Policy &#x27;setup: agent:demo&#x27; now allows core__http_request" in page
    assert "Granted local to agent:demo" in page
    connections = agent.client.get("/api/v1/connections/").json()["connections"]
    assert connections == [{"id": str(setting.connection.pk), "name": "local", "kind": "bearer"}]
    result = ok_result(agent.invoke(HTTP, args={"url": url}, connectionId=connections[0]["id"]))
    assert result["status"] == 200
    assert server.seen[-1].headers["authorization"] == "Bearer SECRET-setup-1234"


def test_setting_up_twice_changes_nothing_and_says_everything_exists(setting, admin_client):
    set_up(admin_client, setting)
    before = rows()
    page = set_up(admin_client, setting).content.decode()
    assert rows() == before
    assert "Nothing to change: everything exists" in page
    assert "(created)" not in page


def test_with_approval_the_call_is_held_and_without_it_runs(setting, admin_client):
    set_up(admin_client, setting, tool=TIME, approval="on")
    agent = setting.agent
    assert agent.invoke(TIME, args={"timezone": "UTC"}).status_code == 202
    set_up(admin_client, setting, tool=TIME)
    assert ok_result(agent.invoke(TIME, args={"timezone": "UTC"}))


def test_a_tool_that_needs_a_connection_cannot_be_set_up_without_one(setting, admin_client):
    response = set_up(admin_client, setting, connection="")
    assert "core__http_request needs a connection" in response.content.decode()
    assert not Policy.objects.filter(tenant=setting.agent.tenant).exists()


def test_a_tenant_admin_cannot_set_up_another_tenant_or_its_connection(setting, admin_client):
    before = rows()
    other_tenant = set_up(admin_client, setting, tenant=setting.stranger.tenant.pk)
    assert "Select a valid choice" in other_tenant.content.decode()
    other_connection = set_up(admin_client, setting, connection=setting.foreign_connection.pk)
    assert "Select a valid choice" in other_connection.content.decode()
    assert rows() == before
    page = admin_client.get(SETUP_URL).content.decode()
    assert "globex" not in page


def test_a_superuser_sees_every_tenant_on_the_setup_page(setting):
    root = User.objects.create_superuser("root", password="pw-root-123456")
    page = logged_in(root).get(SETUP_URL).content.decode()
    assert "acme" in page and "globex" in page


def test_an_operator_may_not_use_the_setup_page(setting):
    assert logged_in(setting.operator).get(SETUP_URL).status_code == 403


def test_an_invalid_principal_is_refused(setting, admin_client):
    response = set_up(admin_client, setting, principal="not a principal")
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()
    assert not Policy.objects.exists()


def test_the_principal_page_lists_what_it_may_use_and_why(setting, admin_client):
    grant_tool(setting.agent.tenant, setting.agent.principal, Tool.objects.get(pk=HTTP),
               setting.connection, approval=True)  # fmt: skip
    page = admin_client.get(
        PRINCIPAL_URL, {"tenant": "acme", "principal": setting.agent.principal}
    ).content.decode()
    assert "core__http_request" in page
    assert "require approval: Rule" in page
    assert str(setting.connection.pk) in page
    assert "core__get_current_time" not in page  # no policy lists it
    index = admin_client.get(PRINCIPALS_URL).content.decode()
    assert "agent:demo" in index and "agent:other" not in index


def test_the_principal_page_of_another_tenant_is_not_found(setting, admin_client):
    response = admin_client.get(
        PRINCIPAL_URL, {"tenant": "globex", "principal": setting.stranger.principal}
    )
    assert response.status_code == 404


def test_grant_tool_refuses_a_connection_of_another_tenant(setting):
    with pytest.raises(setup.SetupError):
        grant_tool(setting.agent.tenant, setting.agent.principal, Tool.objects.get(pk=HTTP),
                   setting.foreign_connection)  # fmt: skip
    assert not Grant.objects.filter(connection=setting.foreign_connection).exists()
