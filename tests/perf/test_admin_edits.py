"""An admin's edit holds on the very next call in every process (issue 13): the call path
may get faster, but never by remembering what a principal was allowed a moment ago.

Two Daphne processes serve the same database; the edits are made through the ORM in the
test's process, as the admin site would, and each server is asked right after."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from apps.connections.models import Grant
from apps.policies.models import Policy, PolicyRule
from apps.tenants.models import ApiKey
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from tests.conftest import Agent, allow, make_agent
from tests.connections import HTTP, grant, make_connection, permit_use
from tests.support.server import Server, daphne

TOOL = "core__get_current_time"


@pytest.fixture
def servers(transactional_db: None) -> Iterator[tuple[Server, Server]]:
    with daphne() as first, daphne() as second:
        yield first, second


def call(base: str, agent: Agent, **fields: Any) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/api/v1/invocations/",
        data=json.dumps({"toolId": TOOL, **fields}).encode(),
        headers={"Authorization": f"Bearer {agent.key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as refused:  # 401: a revoked key
        return {"ok": False, "errorCode": refused.code}
    return body


def outcomes(servers: tuple[Server, Server], agent: Agent, **body: Any) -> list[str | int]:
    """What each server answers now: "ok" or the error code; twice each, so a server
    that answered from a cache filled by the first call would show it on the second."""
    answers: list[str | int] = []
    for base in (*servers, *servers):
        answer = call(base, agent, **body)
        answers.append("ok" if answer["ok"] else answer["errorCode"])
    return answers


@pytest.mark.server
def test_it_applies_an_admins_edit_on_the_next_call_in_every_process(
    servers: tuple[Server, Server],
) -> None:
    agent = make_agent("acme")
    policy = allow(agent.tenant, TOOL)
    assert outcomes(servers, agent) == ["ok"] * 4

    Tool.objects.filter(pk=TOOL).update(enabled=False)  # staff disable the tool
    assert outcomes(servers, agent) == ["unavailable"] * 4
    Tool.objects.filter(pk=TOOL).update(enabled=True)
    assert outcomes(servers, agent) == ["ok"] * 4

    tool = Tool.objects.get(pk=TOOL)
    remove_perm("tools.execute_tool", agents_group(agent.tenant), tool)  # revoke execute_tool
    assert outcomes(servers, agent) == ["authz_denied"] * 4
    assign_perm("tools.execute_tool", agents_group(agent.tenant), tool)
    assert outcomes(servers, agent) == ["ok"] * 4

    rule = PolicyRule(policy=policy, tool_pattern=TOOL, condition="true", outcome="deny")
    rule.full_clean()
    rule.save()  # a rule that denies every call of the tool
    assert outcomes(servers, agent) == ["policy_denied"] * 4
    rule.condition = "false"  # the rule changed: it no longer matches
    rule.save()
    assert outcomes(servers, agent) == ["ok"] * 4

    policy.tools.remove(tool)  # the policy no longer lists it: deny by default
    assert outcomes(servers, agent) == ["policy_denied"] * 4
    policy.tools.add(tool)
    assert outcomes(servers, agent) == ["ok"] * 4

    service_user = ApiKey.objects.get(tenant=agent.tenant).user
    service_user.groups.remove(agents_group(agent.tenant))  # out of the group holding the grant
    assert outcomes(servers, agent) == ["authz_denied"] * 4
    service_user.groups.add(agents_group(agent.tenant))
    assert outcomes(servers, agent) == ["ok"] * 4

    Policy.objects.filter(pk=policy.pk).update(enabled=False)  # the admin's bulk action
    assert outcomes(servers, agent) == ["policy_denied"] * 4
    Policy.objects.filter(pk=policy.pk).update(enabled=True)
    assert outcomes(servers, agent) == ["ok"] * 4

    # Bulk writes send no signals: these bump the epoch through their querysets.
    PolicyRule.objects.filter(pk=rule.pk).update(condition="true")
    assert outcomes(servers, agent) == ["policy_denied"] * 4
    PolicyRule.objects.filter(pk=rule.pk).update(condition="false")
    assert outcomes(servers, agent) == ["ok"] * 4
    User.objects.filter(pk=service_user.pk).update(is_active=False)
    assert outcomes(servers, agent) == ["authz_denied"] * 4
    User.objects.filter(pk=service_user.pk).update(is_active=True)
    assert outcomes(servers, agent) == ["ok"] * 4

    ApiKey.objects.get(tenant=agent.tenant).revoke()  # the key is refused everywhere at once
    assert outcomes(servers, agent) == [401] * 4

    other = make_agent("globex")
    allow(other.tenant, TOOL)
    assert outcomes(servers, other) == ["ok"] * 4
    ApiKey.objects.filter(tenant=other.tenant).update(revoked_at=timezone.now())  # in bulk
    assert outcomes(servers, other) == [401] * 4


@pytest.mark.server
def test_a_grant_revoked_holds_on_the_next_call_in_every_process(
    servers: tuple[Server, Server],
) -> None:
    """Step 4's grant check is cached per process too (apps/connections/grants.py)."""
    agent = make_agent("acme")
    allow(agent.tenant, HTTP)
    connection = make_connection(agent.tenant)
    permit_use(connection)
    the_grant = grant(connection, agent.principal)
    # Past step 4, the host allowlist refuses the URL: "execution" means the grant held.
    body = {
        "toolId": HTTP,
        "args": {"url": "http://elsewhere.example.net/"},
        "connectionId": str(connection.pk),
        "runId": "run-grants",
    }
    assert outcomes(servers, agent, **body) == ["execution"] * 4

    the_grant.revoke()  # the admin's revoke action
    assert outcomes(servers, agent, **body) == ["policy_denied"] * 4
    Grant.objects.filter(pk=the_grant.pk).update(revoked_at=None)  # a bulk edit gives it back
    assert outcomes(servers, agent, **body) == ["execution"] * 4
    Grant.objects.filter(pk=the_grant.pk).delete()  # the admin's bulk delete
    assert outcomes(servers, agent, **body) == ["policy_denied"] * 4
