"""POST/GET /api/v1/invocations/: request validation, tenancy, listing, staff sessions."""

from __future__ import annotations

import json
import uuid

import pytest
from guardian.shortcuts import assign_perm
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord
from apps.tools.models import Tool
from tests.conftest import allow
from tests.support.deep_json import TOO_DEEP, deep_texts, logged_tracebacks
from tests.support.responses import record_of

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/invocations/"
CLOCK = "core__get_current_time"


def post_raw(agent, body: str, content_type: str = "application/json"):
    return agent.client.post(URL, data=body, content_type=content_type)


def error_fields(response) -> list[str]:
    return [error["field"] for error in response.json()["errors"]]


# ---------------------------------------------------------------- malformed requests (400/415)


def test_it_rejects_a_body_that_is_not_json(agent):
    response = post_raw(agent, '{"toolId": "core__get_current_time",')
    assert response.status_code == 400
    assert "JSON" in response.json()["detail"]
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_a_body_that_is_a_json_array(agent):
    response = post_raw(agent, json.dumps([{"toolId": CLOCK}]))
    assert response.status_code == 400
    assert response.json()["detail"] == "The request body must be a JSON object."
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_a_body_nested_too_deeply_to_parse_without_a_500(agent):
    response = post_raw(agent, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    assert InvocationRecord.objects.count() == 0


@deep_texts
def test_it_answers_400_saying_the_body_is_nested_too_deeply(agent, text, caplog):
    response = post_raw(agent, text)
    assert response.status_code == 400
    assert response.json() == {"detail": TOO_DEEP}
    assert InvocationRecord.objects.count() == 0
    assert logged_tracebacks(caplog) == []


def test_it_rejects_a_body_without_a_tool_id(agent):
    response = agent.client.post(URL, {"args": {}}, format="json")
    assert response.status_code == 400
    assert error_fields(response) == ["toolId"]
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_a_tool_call_id_of_129_characters(agent):
    response = agent.invoke(CLOCK, toolCallId="c" * 129)
    assert response.status_code == 400
    assert error_fields(response) == ["toolCallId"]
    assert InvocationRecord.objects.count() == 0


def test_it_accepts_a_tool_call_id_of_exactly_128_characters(agent):
    response = agent.invoke(CLOCK, toolCallId="c" * 128)
    assert response.status_code == 200
    assert response.json()["toolCallId"] == "c" * 128
    assert response.json()["ok"] is True


def test_it_rejects_both_args_and_arguments(agent):
    response = agent.invoke(CLOCK, args={}, arguments="{}")
    assert response.status_code == 400
    assert "not both" in json.dumps(response.json())
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_an_unknown_top_level_key(agent):
    response = agent.invoke(CLOCK, args={}, toolArgs={"timezone": "UTC"})
    assert response.status_code == 400
    assert error_fields(response) == ["toolArgs"]
    assert InvocationRecord.objects.count() == 0


def test_it_rejects_args_that_are_not_an_object_in_the_body(agent):
    response = agent.invoke(CLOCK, args=["UTC"])
    assert response.status_code == 400
    assert error_fields(response) == ["args"]


def test_it_rejects_a_run_id_with_characters_outside_the_identifier_set(agent):
    response = agent.invoke(CLOCK, runId="run with spaces/..")
    assert response.status_code == 400
    assert error_fields(response) == ["runId"]


def test_it_rejects_a_body_that_is_not_json_content_with_415(agent):
    response = agent.client.post(URL, {"toolId": CLOCK})  # multipart form
    assert response.status_code == 415
    assert "detail" in response.json()
    response = post_raw(agent, json.dumps({"toolId": CLOCK}), content_type="text/plain")
    assert response.status_code == 415
    assert InvocationRecord.objects.count() == 0


# ---------------------------------------------------------- tool-level refusals (200, ok false)


def test_it_refuses_args_over_8_kb_as_a_recorded_validation_failure(agent, test_tools):
    allow(agent.tenant, "test__echo")
    response = agent.invoke("test__echo", args={"text": "x" * 9000})
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    assert body["status"] == "failed"
    assert body["errorCode"] == "validation"
    assert "8192" in body["safeMessage"]
    record = record_of(response)
    assert record.error_code == "validation"
    assert record.args is None
    assert record.args_shape == {"text": "string[9000]"}


def test_it_refuses_extra_keys_in_args_naming_the_field(agent):
    response = agent.invoke(CLOCK, args={"timezone": "UTC", "locale": "fr"})
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    assert body["errorCode"] == "validation"
    assert "locale" in body["safeMessage"]
    assert "fr" not in body["safeMessage"].replace("locale", "")


def test_it_refuses_args_of_the_wrong_type_naming_the_field(agent):
    response = agent.invoke(
        "core__planning_update_step", args={"step_id": "1", "status": "done"}, runId="r1"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["errorCode"] == "validation"
    assert "step_id" in body["safeMessage"]


def test_it_refuses_arguments_text_that_is_not_json_without_storing_it(agent):
    raw = '{"timezone": "Europe/Paris", "token": "sk-live-123'
    response = agent.invoke(CLOCK, arguments=raw)
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    assert body["errorCode"] == "invalid_json"
    assert body["safeMessage"] == "The tool arguments are not valid JSON."
    assert "sk-live-123" not in response.content.decode()
    record = record_of(response)
    assert record.error_code == "invalid_json"
    assert record.args is None
    assert record.args_shape is None
    stored = json.dumps([record.args, record.args_shape, record.safe_message, record.result])
    assert "sk-live-123" not in stored
    assert "Europe/Paris" not in stored


def test_it_refuses_arguments_text_nested_too_deeply_as_invalid_json(agent):
    response = agent.invoke(CLOCK, arguments="[" * 100_000)
    assert response.status_code == 200
    assert response.json()["errorCode"] == "invalid_json"
    assert record_of(response).error_code == "invalid_json"


@deep_texts
def test_it_refuses_arguments_text_nested_too_deeply_saying_so(agent, text, caplog):
    response = agent.invoke(CLOCK, arguments=text)
    assert response.status_code == 200
    body = response.json()
    assert body["errorCode"] == "invalid_json"
    assert body["safeMessage"] == f"The tool arguments are refused. {TOO_DEEP}"
    assert record_of(response).args is None
    assert logged_tracebacks(caplog) == []


def test_it_refuses_arguments_json_that_is_not_an_object(agent):
    response = agent.invoke(CLOCK, arguments='["Europe/Paris"]')
    assert response.status_code == 200
    body = response.json()
    assert body["errorCode"] == "validation"
    assert body["safeMessage"] == "The tool arguments must be a JSON object."
    assert record_of(response).args_shape is None


def test_it_accepts_arguments_as_json_text(agent):
    response = agent.invoke(CLOCK, arguments='{"timezone": "Europe/Paris"}')
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is True
    assert body["result"]["timezone"] == "Europe/Paris"
    assert body["args"] == {"timezone": "Europe/Paris"}


def test_it_refuses_an_unknown_tool_as_unavailable(agent):
    response = agent.invoke("core__does_not_exist", args={})
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    assert body["errorCode"] == "unavailable"
    assert "core__does_not_exist" in body["safeMessage"]
    record = record_of(response)
    assert record.tool is None
    assert record.tool_ref == "core__does_not_exist"


def test_it_refuses_a_disabled_tool_as_unavailable(agent):
    Tool.objects.filter(pk=CLOCK).update(enabled=False)
    response = agent.invoke(CLOCK, args={})
    assert response.status_code == 200
    body = response.json()
    assert body["errorCode"] == "unavailable"
    assert "disabled" in body["safeMessage"]
    assert record_of(response).tool_id == CLOCK


def test_it_refuses_a_tool_no_policy_allows_by_default(bare_agent):
    response = bare_agent.invoke(CLOCK, args={})
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    assert body["errorCode"] == "policy_denied"
    assert body["policyRule"] == "default:deny"
    assert record_of(response).policy_rule == "default:deny"


def test_it_refuses_a_tool_missing_from_the_callers_policy(agent, test_tools):
    response = agent.invoke("test__echo", args={"text": "hi"})
    assert response.status_code == 200
    assert response.json()["errorCode"] == "policy_denied"
    assert "test__echo" in response.json()["safeMessage"]


def test_a_disabled_policy_allows_nothing(agent):
    agent.tenant.policies.update(enabled=False)
    response = agent.invoke(CLOCK, args={})
    assert response.json()["errorCode"] == "policy_denied"


# ---------------------------------------------------------------- tenancy


def test_a_key_cannot_read_another_tenants_record(agent, stranger):
    theirs = stranger.invoke(CLOCK, args={}).json()["invocationId"]
    response = agent.client.get(f"{URL}{theirs}/")
    assert response.status_code == 404
    assert stranger.client.get(f"{URL}{theirs}/").status_code == 200


def test_a_tenants_list_never_shows_another_tenants_records(agent, stranger):
    mine = agent.invoke(CLOCK, args={}, runId="shared-run").json()["invocationId"]
    theirs = stranger.invoke(CLOCK, args={}, runId="shared-run").json()["invocationId"]
    for params in ({}, {"runId": "shared-run"}, {"toolId": CLOCK}, {"status": "succeeded"}):
        ids = [r["invocationId"] for r in agent.client.get(URL, params).json()["results"]]
        assert ids == [mine]
        assert theirs not in ids


def test_detail_of_an_unknown_invocation_is_404(agent):
    response = agent.client.get(f"{URL}{uuid.uuid4()}/")
    assert response.status_code == 404
    assert response.json() == {"detail": "No such invocation in your tenant."}


def test_detail_returns_the_record_with_its_fields(agent):
    created = agent.invoke(CLOCK, args={"timezone": "UTC"}, toolCallId="call-1", runId="run-1")
    response = agent.client.get(f"{URL}{created.json()['invocationId']}/")
    assert response.status_code == 200
    body = response.json()
    assert body["toolCallId"] == "call-1"
    assert body["runId"] == "run-1"
    assert body["toolId"] == CLOCK
    assert body["status"] == "succeeded"
    assert body["principal"] == "agent:test"
    assert body["result"] == created.json()["result"]
    assert body["durationMs"] >= 0
    assert body["startedAt"] and body["endedAt"]


# ---------------------------------------------------------------- listing


def test_the_list_filters_by_run_id(agent):
    a = agent.invoke(CLOCK, args={}, runId="run-a").json()["invocationId"]
    agent.invoke(CLOCK, args={}, runId="run-b")
    response = agent.client.get(URL, {"runId": "run-a"})
    assert response.status_code == 200
    assert [r["invocationId"] for r in response.json()["results"]] == [a]


def test_the_list_filters_by_status(agent):
    agent.invoke(CLOCK, args={})
    failed = agent.invoke(CLOCK, args={"timezone": "Mars/Olympus"}).json()["invocationId"]
    response = agent.client.get(URL, {"status": "failed"})
    assert response.status_code == 200
    assert [r["invocationId"] for r in response.json()["results"]] == [failed]


def test_the_list_filters_by_tool_id(agent):
    agent.invoke(CLOCK, args={})
    other = agent.invoke("core__planning_read_plan", args={}).json()["invocationId"]
    response = agent.client.get(URL, {"toolId": "core__planning_read_plan"})
    assert [r["invocationId"] for r in response.json()["results"]] == [other]


def test_the_list_rejects_an_unknown_status(agent):
    response = agent.client.get(URL, {"status": "exploded"})
    assert response.status_code == 400
    assert error_fields(response) == ["status"]


def test_the_list_is_paginated_without_duplicates(agent):
    created = [agent.invoke(CLOCK, args={}).json()["invocationId"] for _ in range(5)]
    first = agent.client.get(URL, {"pageSize": 2})
    assert first.status_code == 200
    page = first.json()
    assert len(page["results"]) == 2
    assert page["next"]
    seen = [r["invocationId"] for r in page["results"]]
    url = page["next"]
    while url:
        page = agent.client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [r["invocationId"] for r in page["results"]]
        url = page["next"]
    assert len(seen) == len(set(seen)) == 5
    assert seen == list(reversed(created))  # newest first


# ---------------------------------------------------------------- staff sessions


@pytest.fixture
def staff_client(staff) -> APIClient:
    client = APIClient()
    client.force_login(staff)
    return client


def test_a_staff_member_without_execute_tool_is_refused_with_authz_denied(
    agent, staff, staff_client
):
    agent.tenant.members.add(staff)
    response = staff_client.post(URL, {"toolId": CLOCK, "args": {}}, format="json")
    assert response.status_code == 200
    assert response.json()["errorCode"] == "authz_denied"


def test_a_staff_member_invokes_with_their_session(agent, staff, staff_client):
    agent.tenant.members.add(staff)
    assign_perm("tools.execute_tool", staff, Tool.objects.get(pk=CLOCK))
    response = staff_client.post(URL, {"toolId": CLOCK, "args": {}}, format="json")
    assert response.status_code == 200
    assert response.json()["ok"] is True
    assert response.json()["principal"] == "user:olivia"
    record = record_of(response)
    assert record.principal == "user:olivia"
    assert record.tenant == agent.tenant


def test_a_staff_member_of_no_tenant_is_told_to_name_one(staff_client, agent):
    response = staff_client.post(URL, {"toolId": CLOCK, "args": {}}, format="json")
    assert response.status_code == 403
    assert "X-Toolhub-Tenant" in response.json()["detail"]
    assert InvocationRecord.objects.count() == 0


def test_a_staff_member_of_two_tenants_must_name_one(agent, stranger, staff, staff_client):
    agent.tenant.members.add(staff)
    stranger.tenant.members.add(staff)
    body = {"toolId": CLOCK, "args": {}}
    response = staff_client.post(URL, body, format="json")
    assert response.status_code == 403
    assert "X-Toolhub-Tenant" in response.json()["detail"]
    response = staff_client.post(URL, body, format="json", HTTP_X_TOOLHUB_TENANT="globex")
    assert response.status_code == 200
    assert record_of(response).tenant == stranger.tenant


def test_a_staff_member_cannot_name_a_tenant_they_do_not_belong_to(
    agent, bare_agent, staff, staff_client
):
    agent.tenant.members.add(staff)
    response = staff_client.post(
        URL, {"toolId": CLOCK, "args": {}}, format="json", HTTP_X_TOOLHUB_TENANT="initech"
    )
    assert response.status_code == 403
    assert "initech" in response.json()["detail"]
    assert InvocationRecord.objects.count() == 0


def test_a_staff_member_lists_only_their_tenants_records(agent, stranger, staff, staff_client):
    agent.tenant.members.add(staff)
    mine = agent.invoke(CLOCK, args={}).json()["invocationId"]
    stranger.invoke(CLOCK, args={})
    response = staff_client.get(URL)
    assert response.status_code == 200
    assert [r["invocationId"] for r in response.json()["results"]] == [mine]
