"""POST /api/v1/simulations/: the dry run answers what a call would do, and does nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import AdmittedCall, CallWindow, InvocationRecord, RunEvent
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tenants.roles import Role, grant_role
from tests.conftest import Agent, allow, make_agent
from tests.connections import HTTP, make_connection, usable

TIME = "core__get_current_time"
PARIS = {"timezone": "Europe/Paris"}


def simulate(agent: Agent, tool_id: str, **body: Any) -> dict[str, Any]:
    response = agent.client.post("/api/v1/simulations/", {"toolId": tool_id, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def verdicts(answer: dict[str, Any]) -> dict[str, str]:
    return {check["check"]: check["verdict"] for check in answer["checks"]}


def footprint() -> dict[str, int]:
    """Everything a call could leave behind."""
    return {
        "records": InvocationRecord.objects.count(),
        "events": RunEvent.objects.count(),
        "approvals": ApprovalRequest.objects.count(),
        "windows": CallWindow.objects.count(),
        "admitted": AdmittedCall.objects.count(),
        "users": User.objects.count(),
    }


def test_it_answers_allow_with_the_deciding_policy_and_every_check_passed(agent):
    answer = simulate(agent, TIME, args=PARIS)
    assert answer["decision"] == "allow"
    assert answer["argsValid"] is True
    assert answer["policyRule"].startswith("policy:")
    assert "errorCode" not in answer and "connectionOk" not in answer
    assert set(verdicts(answer).values()) == {"pass"}
    assert any("Not held" in reason for reason in answer["reasons"])


def test_it_answers_deny_by_default_for_a_tenant_without_policy(bare_agent):
    answer = simulate(bare_agent, TIME, args=PARIS)
    assert answer["decision"] == "deny"
    assert answer["errorCode"] == "policy_denied"
    assert answer["policyRule"] == "default:deny"
    assert verdicts(answer)["check_policy"] == "fail"
    assert verdicts(answer)["apply_rules"] == "not_reached"


def test_it_answers_require_approval_when_a_policy_holds_the_effect(agent):
    Policy.objects.filter(tenant=agent.tenant).update(approval_effects=["read_only"])
    answer = simulate(agent, TIME, args=PARIS)
    assert answer["decision"] == "require_approval"
    assert "errorCode" not in answer
    assert verdicts(answer)["hold_for_approval"] == "pass"


def test_a_deny_rule_is_named_in_the_answer(agent):
    policy = Policy.objects.get(tenant=agent.tenant)
    rule = PolicyRule.objects.create(
        policy=policy,
        tool_pattern=TIME,
        condition='args.timezone == "Europe/Paris"',
        outcome=Outcome.DENY,
        description="no Paris",
    )
    answer = simulate(agent, TIME, args=PARIS)
    assert answer["decision"] == "deny"
    assert answer["policyRule"] == rule.label
    assert f"Rule {rule.pk} of policy" in answer["safeMessage"]
    assert "no Paris" in answer["safeMessage"]
    assert simulate(agent, TIME, args={"timezone": "UTC"})["decision"] == "allow"


def test_a_rule_on_an_absent_field_denies_naming_the_rule_and_has(agent):
    policy = Policy.objects.get(tenant=agent.tenant)
    rule = PolicyRule.objects.create(
        policy=policy, tool_pattern=TIME, condition="args.missing > 1", outcome=Outcome.DENY
    )
    answer = simulate(agent, TIME, args=PARIS)
    assert answer["decision"] == "deny"
    assert answer["policyRule"] == rule.label
    assert "KeyError" not in answer["safeMessage"]
    assert "has(args.missing)" in answer["safeMessage"]
    assert f"Rule {rule.pk}" in answer["safeMessage"]


def test_invalid_arguments_are_listed_field_by_field(agent):
    answer = simulate(agent, TIME, args={"timezone": 5, "extra": 1})
    assert answer["decision"] == "deny"
    assert answer["errorCode"] == "validation"
    assert answer["argsValid"] is False
    fields = {error["field"] for error in answer["validationErrors"]}
    assert {"timezone", "extra"} <= fields
    assert verdicts(answer)["apply_rules"] == "not_reached"


def test_arguments_that_are_not_json_answer_invalid_json(agent):
    answer = simulate(agent, TIME, arguments="{not json")
    assert answer["errorCode"] == "invalid_json"
    assert answer["argsValid"] is False


def test_an_unknown_tool_answers_unavailable_and_reaches_no_other_check(agent):
    answer = simulate(agent, "core__no_such_tool")
    assert answer["decision"] == "deny"
    assert answer["errorCode"] == "unavailable"
    checks = verdicts(answer)
    assert checks.pop("lookup_tool") == "fail"
    assert set(checks.values()) == {"not_reached"}


def test_a_policy_that_allows_without_execute_tool_answers_authz_denied(bare_agent):
    Policy.objects.create(tenant=bare_agent.tenant, name="lists only", tool_patterns="core__*")
    answer = simulate(bare_agent, TIME, args=PARIS)
    assert answer["errorCode"] == "authz_denied"
    assert verdicts(answer)["check_policy"] == "pass"
    assert verdicts(answer)["check_permission"] == "fail"


def test_an_unknown_or_foreign_connection_answers_connection_not_ok(agent, stranger):
    allow(agent.tenant, HTTP, name="http")
    foreign = usable(make_connection(stranger.tenant, name="globex"), agent.principal)
    args = {"url": "https://api.example.com/"}
    for connection_id in ("not-a-uuid", "8d3c1f3e-6a43-4f0e-9d6b-1f1f1f1f1f1f", str(foreign.pk)):
        answer = simulate(agent, HTTP, args=args, connectionId=connection_id)
        assert answer["connectionOk"] is False
        assert answer["errorCode"] == "policy_denied"
        assert answer["safeMessage"] == "That connection is not granted to this caller."
    own = usable(make_connection(agent.tenant, name="own"), agent.principal)
    answer = simulate(agent, HTTP, args=args, connectionId=str(own.pk))
    assert answer["connectionOk"] is True
    assert answer["decision"] == "allow"


def test_a_dry_run_records_holds_and_counts_nothing(agent):
    policy = Policy.objects.get(tenant=agent.tenant)
    policy.approval_effects = ["read_only"]
    policy.calls_per_minute = 1
    policy.save()
    before = footprint()
    for _ in range(3):
        assert simulate(agent, TIME, args=PARIS, idempotencyKey="k-1")["decision"] == (
            "require_approval"
        )
        simulate(agent, "core__no_such_tool")
        simulate(agent, TIME, args={"timezone": 1})
    assert footprint() == before
    # The one slot a minute is still free: the real call is admitted (and held).
    assert agent.invoke(TIME, args=PARIS).status_code == 202


def test_a_dry_run_reports_a_spent_rate_limit_without_taking_a_slot(agent):
    Policy.objects.filter(tenant=agent.tenant).update(calls_per_minute=1)
    assert agent.invoke(TIME, args=PARIS).status_code == 200
    before = footprint()
    answer = simulate(agent, TIME, args=PARIS)
    assert answer["errorCode"] == "rate_limited"
    assert footprint() == before


# ---------------------------------------------------------------- on someone's behalf


@pytest.fixture
def tenant_admin(agent: Agent) -> Client:
    user = User.objects.create_user("ada", password="pw-ada-123456")
    grant_role(user, agent.tenant, Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


def ask(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/simulations/", body, content_type="application/json")


def test_staff_may_ask_on_behalf_of_their_tenants_principal(agent, tenant_admin):
    body = {"toolId": TIME, "args": PARIS, "tenant": "acme", "principal": agent.principal}
    response = ask(tenant_admin, body)
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == "allow"
    Policy.objects.filter(tenant=agent.tenant).update(enabled=False)
    assert ask(tenant_admin, body).json()["errorCode"] == "policy_denied"


def test_staff_cannot_ask_on_behalf_of_another_tenants_principal(tenant_admin, stranger):
    body = {"toolId": TIME, "tenant": "globex", "principal": stranger.principal}
    response = ask(tenant_admin, body)
    assert response.status_code == 403
    assert "globex" in response.json()["detail"]


def test_an_unknown_principal_is_a_bad_request_and_creates_no_user(agent, tenant_admin):
    users = User.objects.count()
    response = ask(tenant_admin, {"toolId": TIME, "tenant": "acme", "principal": "agent:typo"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "principal"
    assert User.objects.count() == users


def test_a_principal_without_a_tenant_is_a_bad_request(agent, tenant_admin):
    response = ask(tenant_admin, {"toolId": TIME, "principal": agent.principal})
    assert response.status_code == 400


def test_an_agent_cannot_ask_on_behalf_of_another_principal(agent):
    other = make_agent("acme", "agent:other-bot")
    assert other.principal == "agent:other-bot"
    response = agent.client.post(
        "/api/v1/simulations/",
        {"toolId": TIME, "tenant": "acme", "principal": "agent:other-bot"},
        format="json",
    )
    assert response.status_code == 403


def test_a_malformed_body_is_a_bad_request(agent):
    response = agent.client.post("/api/v1/simulations/", {"args": {}}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "toolId"
