"""Per-run narrowing: a run started with a tool allowlist (POST /api/v1/runs/)."""

from __future__ import annotations

import pytest

from apps.invocations.models import Run
from apps.policies.models import Policy
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

CLOCK = "core__get_current_time"
READ_PLAN = "core__planning_read_plan"


def start(agent, tools, run_id="run-a"):
    body = {"tools": tools} if run_id is None else {"runId": run_id, "tools": tools}
    return agent.client.post("/api/v1/runs/", body, format="json")


def listed(agent, run_id, wire=""):
    params = {"runId": run_id, **({"format": wire} if wire else {})}
    response = agent.tools(**params)
    assert response.status_code == 200, response.content
    tools = response.json()["tools"]
    return [t.get("id") or t.get("name") or t["function"]["name"] for t in tools]


def test_a_run_started_with_an_allowlist_lists_only_those_tools_in_every_shape(agent):
    response = start(agent, [READ_PLAN, CLOCK, CLOCK])
    assert response.status_code == 201, response.content
    assert response.json() == {
        "runId": "run-a",
        "tools": [CLOCK, READ_PLAN],
        "startedBy": agent.principal,
    }
    for wire in ("", "openai", "anthropic"):
        assert listed(agent, "run-a", wire) == [CLOCK, READ_PLAN]
    assert len(listed(agent, "run-other")) > 2  # a run without one: the whole catalog


def test_a_call_outside_the_runs_allowlist_is_refused_naming_the_allowlist(agent):
    assert start(agent, [CLOCK]).status_code == 201
    inside = agent.invoke(CLOCK, runId="run-a").json()
    assert inside["ok"] is True
    outside = agent.invoke(READ_PLAN, args={"plan_id": "x"}, runId="run-a").json()
    assert outside["ok"] is False
    assert outside["errorCode"] == "policy_denied"
    assert outside["safeMessage"] == (
        f"The run run-a may call only {CLOCK} (its allowlist); {READ_PLAN} is not on it."
    )
    elsewhere = agent.invoke(READ_PLAN, args={"plan_id": "x"}, runId="run-b").json()
    assert elsewhere.get("errorCode") != "policy_denied"


def test_wire_batches_of_a_narrowed_run_are_refused_outside_it(agent):
    assert start(agent, [CLOCK]).status_code == 201
    calls = [
        {"id": "c1", "type": "function", "function": {"name": CLOCK, "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": READ_PLAN, "arguments": "{}"}},
    ]
    response = agent.client.post(
        "/api/v1/wire/openai/tool-calls/", {"runId": "run-a", "toolCalls": calls}, format="json"
    )
    assert response.status_code == 200, response.content
    first, second = response.json()["messages"]
    assert "policy_denied" not in first["content"]
    assert "policy_denied" in second["content"] and "its allowlist" in second["content"]


def test_a_dry_run_reports_the_runs_allowlist(agent):
    assert start(agent, [CLOCK]).status_code == 201
    body = {"toolId": READ_PLAN, "args": {"plan_id": "x"}, "runId": "run-a"}
    answer = agent.client.post("/api/v1/simulations/", body, format="json").json()
    assert answer["decision"] == "deny"
    assert answer["errorCode"] == "policy_denied"
    assert any(
        reason.startswith("check_run: The run run-a may call only") for reason in answer["reasons"]
    )


def test_without_a_run_id_a_new_run_is_started(agent):
    response = start(agent, [CLOCK], run_id=None)
    assert response.status_code == 201
    run_id = response.json()["runId"]
    assert run_id.startswith("run_")
    assert listed(agent, run_id) == [CLOCK]


def test_the_same_start_again_is_answered_200_and_changes_nothing(agent):
    assert start(agent, [CLOCK, READ_PLAN]).status_code == 201
    again = start(agent, [READ_PLAN, CLOCK])
    assert again.status_code == 200
    assert again.json()["tools"] == [CLOCK, READ_PLAN]


def test_a_second_start_with_a_wider_or_narrower_list_is_a_conflict(agent):
    assert start(agent, [CLOCK]).status_code == 201
    wider = start(agent, [CLOCK, READ_PLAN])
    assert wider.status_code == 409
    assert wider.json()["detail"] == (
        f"The run run-a was started with another allowlist (it does not list {READ_PLAN}); "
        "a run's allowlist is fixed once set: start a new run."
    )
    assert start(agent, [READ_PLAN]).status_code == 409
    assert listed(agent, "run-a") == [CLOCK]
    assert Run.objects.get(run_id="run-a").tool_allowlist == [CLOCK]


def test_a_run_that_already_has_calls_cannot_be_narrowed_afterwards(agent):
    assert agent.invoke(CLOCK, runId="run-a").json()["ok"] is True
    response = start(agent, [CLOCK])
    assert response.status_code == 409
    assert "already has calls without an allowlist" in response.json()["detail"]
    assert (
        agent.invoke(READ_PLAN, args={"plan_id": "x"}, runId="run-a").json().get("errorCode")
        != "policy_denied"
    )


def test_an_allowlist_naming_tools_that_do_not_exist_is_refused_naming_them(agent):
    response = start(agent, [CLOCK, "core__no_such_tool", "mcp__gone__x"])
    assert response.status_code == 400
    message = (
        "Not in this caller's catalog (GET /api/v1/tools/ lists it): "
        "core__no_such_tool, mcp__gone__x."
    )
    assert response.json() == {
        "detail": message,
        "errors": [{"field": "tools", "message": message}],
    }
    assert not Run.objects.filter(run_id="run-a").exists()


def test_a_tool_the_principal_may_not_use_is_refused_like_one_that_does_not_exist(agent):
    """core__send_email exists, but agent's policy does not list it: the answer says no
    more than for an id that names nothing."""
    forbidden = start(agent, ["core__send_email"]).json()["detail"]
    missing = start(agent, ["core__send_mail"]).json()["detail"]
    assert forbidden == missing.replace("core__send_mail", "core__send_email")


def test_another_tenants_tool_is_refused_without_saying_so(agent, stranger):
    Policy.objects.filter(tenant=agent.tenant).delete()  # agent may use nothing now
    response = start(agent, [CLOCK])
    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"Not in this caller's catalog (GET /api/v1/tools/ lists it): {CLOCK}."
    )
    assert start(stranger, [CLOCK]).status_code == 201  # a run id is per tenant


def test_an_empty_allowlist_is_refused(agent):
    response = start(agent, [])
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "An allowlist names at least one tool; omit it to use any tool."
    )
    assert start(agent, [""]).status_code == 400  # not an id at all
    assert agent.client.post("/api/v1/runs/", {}, format="json").status_code == 400


def test_narrowing_never_grants_what_a_policy_takes_away(agent):
    assert start(agent, [CLOCK, READ_PLAN]).status_code == 201
    policy = Policy.objects.get(tenant=agent.tenant)
    policy.tools.remove(READ_PLAN)
    assert listed(agent, "run-a") == [CLOCK]
    refused = agent.invoke(READ_PLAN, args={"plan_id": "x"}, runId="run-a").json()
    assert refused["errorCode"] == "policy_denied"
    assert "its allowlist" not in refused["safeMessage"]  # the policy said no


def test_a_bad_run_id_in_the_catalog_query_is_a_400(agent):
    response = agent.tools(runId="no spaces")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "runId"


def test_every_principal_of_the_tenant_is_held_to_the_runs_allowlist(agent):
    assert start(agent, [CLOCK]).status_code == 201
    colleague = make_agent(agent.tenant.slug, "agent:colleague")
    refused = colleague.invoke(READ_PLAN, args={"plan_id": "x"}, runId="run-a").json()
    assert refused["errorCode"] == "policy_denied"
    assert "its allowlist" in refused["safeMessage"]
