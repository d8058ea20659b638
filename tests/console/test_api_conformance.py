"""The OpenAPI document tells the truth: real answers (status, body) match it.

Each test makes a real request through Django's test client and checks the answer
against the served schema: the status must be documented for that operation, and the
body must validate against the documented schema (JSON Schema 2020-12, the dialect of
OpenAPI 3.1), with undocumented properties refused.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import JsonResponse
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from jsonschema import Draft202012Validator, FormatChecker
from rest_framework.test import APIClient

from apps.approvals import decisions
from tests.approvals.support import CONFIRM, ECHO, hold, logged_in, make_operator
from tests.conftest import allow
from tests.support.ledger import stuck_call

pytestmark = pytest.mark.django_db(transaction=True)

SLEEP = "test__sleep"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    from django.test import Client as PlainClient

    # The schema view reads no database: fetch it once per module.
    response = PlainClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever properties are listed, so a
    field the document does not mention fails validation."""
    if isinstance(schema, dict):
        out = {key: closed(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


def check(document: dict[str, Any], response: Any, method: str, path: str) -> Any:
    """Asserts that `response` is a documented answer of `method path`; returns its body."""
    operation = document["paths"][path][method.lower()]
    code = str(response.status_code)
    documented = operation["responses"]
    assert code in documented, (
        f"{method} {path} answered {code}, the document lists {sorted(documented)}: "
        f"{response.content[:300]!r}"
    )
    content = documented[code].get("content")
    if content is None:
        assert not response.content, f"{method} {path} {code} has an undocumented body"
        return None
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    schema = closed(copy.deepcopy({**content["application/json"]["schema"]}))
    schema["components"] = closed(copy.deepcopy(document["components"]))
    validator = Draft202012Validator(schema, format_checker=FormatChecker())
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message}"
        for e in validator.iter_errors(body)
    ]
    assert not errors, f"{method} {path} {code} disagrees with the document: {errors}\n{body}"
    return body


# ---------------------------------------------------------------- the document itself


def api_routes(patterns: Any, prefix: str = "") -> list[str]:
    routes = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            routes += api_routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            routes.append(prefix + str(entry.pattern))
    return routes


def test_every_api_route_is_in_the_document(document):
    routes = {
        "/" + route.replace("<uuid:", "{").replace(">", "}")
        for route in api_routes(get_resolver().url_patterns)
        if route.startswith("api/v1/") and route != "api/v1/schema/"
    }
    assert routes <= set(document["paths"]), routes - set(document["paths"])


def test_no_description_is_a_docstring(document):
    from apps.invocations.api.serializers import InvocationSerializer
    from toolhub.web.api import CallerView

    texts = json.dumps(document)
    for source in (CallerView, InvocationSerializer):
        doc = (source.__doc__ or "").strip().split("\n")[0]
        assert doc and doc not in texts, doc


def test_the_document_names_the_tenant_header_and_links_the_websocket_protocol(document):
    parameters = document["paths"]["/api/v1/invocations/"]["post"]["parameters"]
    assert any(p["name"] == "X-Toolhub-Tenant" and p["in"] == "header" for p in parameters)
    assert "/api/docs/websockets/" in document["info"]["description"]


def test_lists_are_documented_as_cursor_pages(document):
    for path in ("/api/v1/invocations/", "/api/v1/approvals/"):
        operation = document["paths"][path]["get"]
        names = {p["name"] for p in operation["parameters"]}
        assert "cursor" in names
        ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        page = document["components"]["schemas"][ref.split("/")[-1]]
        assert set(page["properties"]) == {"next", "previous", "results"}
    invocation_params = document["paths"]["/api/v1/invocations/"]["get"]["parameters"]
    assert "pageSize" in {p["name"] for p in invocation_params}


def test_every_example_in_the_document_matches_its_schema(document):
    found = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            bodies = [operation.get("requestBody", {})]
            bodies += list(operation["responses"].values())
            for body in bodies:
                for media in body.get("content", {}).values():
                    schema = closed({**media["schema"]})
                    schema["components"] = closed(document["components"])
                    validator = Draft202012Validator(schema, format_checker=FormatChecker())
                    for name, example in media.get("examples", {}).items():
                        found += 1
                        errors = [e.message for e in validator.iter_errors(example["value"])]
                        assert not errors, (method, path, name, errors)
    assert found >= 8


# ---------------------------------------------------------------- tools


def test_the_catalog_answers_as_documented(document, caller):
    for wire in ("", "openai", "anthropic"):
        check(
            document,
            caller.client.get("/api/v1/tools/", {"format": wire} if wire else {}),
            "GET",
            "/api/v1/tools/",
        )
    check(document, caller.client.get("/api/v1/tools/", {"format": "xml"}), "GET", "/api/v1/tools/")
    check(document, APIClient().get("/api/v1/tools/"), "GET", "/api/v1/tools/")


def test_a_staff_member_of_two_tenants_without_the_header_gets_the_documented_403(
    document, caller, other
):
    both = make_operator("two", caller.tenant, other.tenant)
    client = logged_in(both)

    refused = client.get("/api/v1/tools/")
    chosen = client.get("/api/v1/tools/", HTTP_X_TOOLHUB_TENANT="acme")

    assert refused.status_code == 403
    check(document, refused, "GET", "/api/v1/tools/")
    assert chosen.status_code == 200
    check(document, chosen, "GET", "/api/v1/tools/")


# ---------------------------------------------------------------- invocations

INVOKE = "/api/v1/invocations/"


def test_invoking_answers_as_documented(document, caller):
    succeeded = caller.invoke(ECHO, args={"text": "hi"}, runId="run-doc")
    failed = caller.invoke(ECHO, args={"text": 5})
    denied = caller.invoke("test__crash", args={})
    held = caller.invoke(CONFIRM, args={})
    malformed = caller.client.post(INVOKE, {"args": {}}, format="json")
    not_json = caller.client.post(INVOKE, "{", content_type="application/json")
    anonymous = APIClient().post(INVOKE, {"toolId": ECHO}, format="json")

    assert [r.status_code for r in (succeeded, failed, denied, held)] == [200, 200, 200, 202]
    assert [r.status_code for r in (malformed, not_json, anonymous)] == [400, 400, 401]
    for response in (succeeded, failed, denied, held, malformed, not_json, anonymous):
        check(document, response, "POST", INVOKE)


def test_a_rate_limited_call_answers_as_documented(document, caller):
    policy = allow(caller.tenant, ECHO, name="limited")
    policy.calls_per_minute = 1
    policy.save()
    caller.invoke(ECHO, args={"text": "1"})

    limited = caller.invoke(ECHO, args={"text": "2"})

    body = check(document, limited, "POST", INVOKE)
    assert limited.status_code == 200 and body["errorCode"] == "rate_limited"
    assert int(limited["Retry-After"]) >= 1


def test_a_retry_whose_first_attempt_is_stuck_answers_the_documented_409(document, caller):
    args = {"seconds": 0.1}
    allow(caller.tenant, SLEEP, name="sleep")
    stuck_call(caller.tenant, caller.principal, SLEEP, args, "stuck-1")

    retry = caller.invoke(SLEEP, args=args, idempotencyKey="stuck-1")

    assert retry.status_code == 409
    check(document, retry, "POST", INVOKE)


def test_reading_invocations_answers_as_documented(document, caller, other):
    first = caller.invoke(ECHO, args={"text": "a"}).json()
    caller.invoke(ECHO, args={"text": "b"})
    theirs = other.invoke(ECHO, args={"text": "c"}).json()
    detail = "/api/v1/invocations/{invocation_id}/"

    page = check(document, caller.client.get(INVOKE, {"pageSize": 1}), "GET", INVOKE)
    assert page["next"] and page["previous"] is None and len(page["results"]) == 1
    second = check(document, caller.client.get(page["next"]), "GET", INVOKE)
    assert second["previous"]
    check(document, caller.client.get(INVOKE, {"cursor": "garbage"}), "GET", INVOKE)
    check(document, caller.client.get(INVOKE, {"status": "nope"}), "GET", INVOKE)
    check(document, APIClient().get(INVOKE), "GET", INVOKE)
    found = caller.client.get(f"{INVOKE}{first['invocationId']}/")
    missing = caller.client.get(f"{INVOKE}{theirs['invocationId']}/")
    assert (found.status_code, missing.status_code) == (200, 404)
    check(document, found, "GET", detail)
    check(document, missing, "GET", detail)


def test_cancelling_answers_as_documented(document, caller):
    held = caller.invoke(CONFIRM, args={}).json()
    done = caller.invoke(ECHO, args={"text": "x"}).json()
    path = "/api/v1/invocations/{invocation_id}/cancel/"

    cancelled = caller.client.post(f"{INVOKE}{held['invocationId']}/cancel/")
    too_late = caller.client.post(f"{INVOKE}{done['invocationId']}/cancel/")

    assert (cancelled.status_code, too_late.status_code) == (200, 409)
    check(document, cancelled, "POST", path)
    check(document, too_late, "POST", path)


# ---------------------------------------------------------------- approvals


def test_approvals_answer_as_documented(document, caller, operator):
    _, approval = hold(caller, CONFIRM)
    _, other_approval = hold(caller, CONFIRM)
    client = logged_in(operator)
    decision = "/api/v1/approvals/{approval_id}/decision/"

    listed = check(
        document,
        client.get("/api/v1/approvals/", {"status": "pending"}),
        "GET",
        "/api/v1/approvals/",
    )
    assert len(listed["results"]) == 2
    check(
        document, client.get("/api/v1/approvals/", {"status": "nope"}), "GET", "/api/v1/approvals/"
    )
    check(document, caller.client.get("/api/v1/approvals/"), "GET", "/api/v1/approvals/")
    check(document, APIClient().get("/api/v1/approvals/"), "GET", "/api/v1/approvals/")
    check(
        document,
        client.get(f"/api/v1/approvals/{approval.pk}/"),
        "GET",
        "/api/v1/approvals/{approval_id}/",
    )
    check(
        document,
        client.get("/api/v1/approvals/00000000-0000-0000-0000-000000000000/"),
        "GET",
        "/api/v1/approvals/{approval_id}/",
    )
    approved = client.post(
        f"/api/v1/approvals/{approval.pk}/decision/", {"decision": "approve"}, format="json"
    )
    again = client.post(
        f"/api/v1/approvals/{approval.pk}/decision/", {"decision": "reject"}, format="json"
    )
    bad = client.post(
        f"/api/v1/approvals/{other_approval.pk}/decision/", {"decision": "maybe"}, format="json"
    )
    by_agent = caller.client.post(
        f"/api/v1/approvals/{other_approval.pk}/decision/", {"decision": "approve"}, format="json"
    )
    assert [r.status_code for r in (approved, again, bad, by_agent)] == [200, 409, 400, 403]
    for response in (approved, again, bad, by_agent):
        check(document, response, "POST", decision)


def test_a_rejection_answers_as_documented(document, caller, operator):
    _, approval = hold(caller, CONFIRM)
    response = logged_in(operator).post(
        f"/api/v1/approvals/{approval.pk}/decision/",
        {"decision": "reject", "reason": "No."},
        format="json",
    )
    assert (
        check(document, response, "POST", "/api/v1/approvals/{approval_id}/decision/")["status"]
        == "rejected"
    )
    decisions.expire_if_overdue_safely(approval.pk)


# ---------------------------------------------------------------- stream tickets and wire


def test_stream_tickets_answer_201_as_documented(document, caller):
    path = "/api/v1/stream-tickets/"

    created = caller.client.post(path, {"runId": "run-1"}, format="json")
    invalid = caller.client.post(path, {"runId": "bad id!"}, format="json")
    anonymous = APIClient().post(path, {"runId": "run-1"}, format="json")

    assert [r.status_code for r in (created, invalid, anonymous)] == [201, 400, 401]
    for response in (created, invalid, anonymous):
        check(document, response, "POST", path)


def test_starting_runs_answers_as_documented(document, caller):
    path = "/api/v1/runs/"

    def start(tools: list[str]) -> Any:
        return caller.client.post(path, {"runId": "run-n", "tools": tools}, format="json")

    created, again, other, outside = start([ECHO]), start([ECHO]), start([CONFIRM]), start(["x"])
    anonymous = APIClient().post(path, {"tools": [ECHO]}, format="json")

    statuses = [r.status_code for r in (created, again, other, outside, anonymous)]
    assert statuses == [201, 200, 409, 400, 401]
    for response in (created, again, other, outside, anonymous):
        check(document, response, "POST", path)


def test_wire_batches_answer_as_documented(document, caller):
    openai = caller.client.post(
        "/api/v1/wire/openai/tool-calls/",
        {
            "toolCalls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": ECHO, "arguments": json.dumps({"text": "hi"})},
                }
            ]
        },
        format="json",
    )
    anthropic = caller.client.post(
        "/api/v1/wire/anthropic/tool-use/",
        {"content": [{"type": "tool_use", "id": "toolu_1", "name": ECHO, "input": {"text": "hi"}}]},
        format="json",
    )
    assert (openai.status_code, anthropic.status_code) == (200, 200)
    check(document, openai, "POST", "/api/v1/wire/openai/tool-calls/")
    check(document, anthropic, "POST", "/api/v1/wire/anthropic/tool-use/")


def test_the_connections_list_answers_as_documented(document, caller):
    check(document, caller.client.get("/api/v1/connections/"), "GET", "/api/v1/connections/")


def test_a_staff_member_without_a_tenant_gets_the_documented_403(document):
    loner = User.objects.create_user("loner", password="pw-loner-12345", is_staff=True)
    client = Client()
    client.force_login(loner)

    response = client.post(INVOKE, {"toolId": ECHO}, content_type="application/json")

    assert response.status_code == 403
    check(document, response, "POST", INVOKE)


def test_the_checker_refuses_an_undocumented_status(document, caller):
    """The check itself can fail: a 418 is in no operation's responses."""

    class Fake:
        status_code = 418
        content = b"{}"

    with pytest.raises(AssertionError, match="answered 418"):
        check(document, Fake(), "GET", "/api/v1/tools/")


def test_the_checker_refuses_an_undocumented_field(document, caller):
    real = caller.invoke(ECHO, args={"text": "hi"})
    response = JsonResponse({**real.json(), "surprise": 1}, status=real.status_code)

    with pytest.raises(AssertionError, match="surprise"):
        check(document, response, "POST", INVOKE)
