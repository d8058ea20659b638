"""The WebSocket protocol document (docs/asyncapi.yaml, rendered at /api/docs/websockets/)
tells the truth: real event messages validate against its payloads, its close codes are
the ones the streams send, and a developer finds it from /api/docs/."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from jsonschema import Draft202012Validator, FormatChecker

from apps.approvals import decisions
from apps.invocations import streams
from apps.invocations.models import RunEvent
from tests.approvals.support import CONFIRM, ECHO, drain_queue, hold
from tests.conftest import allow
from toolhub.apidocs.websocket_docs import asyncapi
from toolhub.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def payload_validator(message_key: str) -> Draft202012Validator:
    document = asyncapi()
    ref = document["components"]["messages"][message_key]["payload"]["$ref"]
    schema = {"$ref": ref, "components": document["components"]}
    return Draft202012Validator(schema, format_checker=FormatChecker())


MESSAGE_KEYS = {
    "tool_call_start": "toolCallStart",
    "tool_call_retry": "toolCallRetry",
    "tool_call_result": "toolCallResult",
    "approval_required": "approvalRequired",
    "approval_decided": "approvalDecided",
}


def assert_documented(message: dict[str, Any]) -> None:
    validator = payload_validator(MESSAGE_KEYS[message["type"]])
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(message)]
    assert not errors, f"{message['type']} disagrees with docs/asyncapi.yaml: {errors}\n{message}"


def test_every_real_kind_of_event_matches_the_document(caller, operator):
    caller.invoke(ECHO, args={"text": "ok"}, runId="run-doc")
    caller.invoke(ECHO, args={"text": 5}, runId="run-doc")  # validation
    caller.invoke("test__crash", args={}, runId="run-doc")  # denied
    _, approved = hold(caller, CONFIRM, runId="run-doc")
    _, rejected = hold(caller, CONFIRM, runId="run-doc")
    _, cancelled = hold(caller, CONFIRM, runId="run-doc")
    decisions.decide(approved.pk, operator, "approve", "fine")
    decisions.decide(rejected.pk, operator, "reject", "no")
    decisions.cancel(cancelled.pk, by=caller.principal, user=None)
    drain_queue()

    messages = [e.message for e in RunEvent.objects.filter(run_id="run-doc").order_by("seq")]

    kinds = {(m["type"], m.get("errorCode"), m.get("decision")) for m in messages}
    assert ("tool_call_result", None, None) in kinds
    assert {("tool_call_result", code, None) for code in ("validation", "policy_denied")} <= kinds
    assert {("approval_decided", None, d) for d in ("approve", "reject", "cancel")} <= kinds
    assert ("approval_required", None, None) in kinds
    for message in messages:
        assert_documented(message)


def test_a_rate_limited_result_matches_the_document(caller):
    policy = allow(caller.tenant, ECHO, name="limited")
    policy.calls_per_minute = 1
    policy.save()
    caller.invoke(ECHO, args={"text": "1"}, runId="run-limit")
    caller.invoke(ECHO, args={"text": "2"}, runId="run-limit")

    result = RunEvent.objects.filter(run_id="run-limit", type="tool_call_result").last()

    assert result is not None and result.message["errorCode"] == "rate_limited"
    assert_documented(result.message)


def test_the_documents_examples_match_their_payloads():
    for key, message in asyncapi()["components"]["messages"].items():
        validator = payload_validator(key)
        assert message["examples"], key
        for example in message["examples"]:
            errors = [e.message for e in validator.iter_errors(example["payload"])]
            assert not errors, (key, example["name"], errors)


def test_the_checker_refuses_an_undocumented_field(caller):
    caller.invoke(ECHO, args={"text": "ok"}, runId="run-x")
    message = RunEvent.objects.filter(run_id="run-x", type="tool_call_start").get().message

    with pytest.raises(AssertionError, match="surprise"):
        assert_documented({**message, "surprise": True})


def test_the_documented_close_codes_are_the_ones_the_streams_send():
    documented = {c["code"] for c in asyncapi()["x-close-codes"]["codes"]}

    assert documented == {
        streams.CLOSE_BAD_REQUEST,
        streams.CLOSE_FORBIDDEN,
        streams.CLOSE_GONE,
        streams.CLOSE_NOT_FOUND,
        streams.CLOSE_TOO_SLOW,
        streams.CLOSE_INTERNAL,
        streams.CLOSE_RESTARTING,
        settings.TOOLHUB_WS_CLOSE_TOO_MANY,
    }


@pytest.mark.parametrize(
    ("path", "code"),
    [("/ws/v1/runs/run-1/", 4403), ("/ws/v1/runs/run-1/?after=x", 4400), ("/ws/v1/nope/", 4404)],
)
async def test_a_refused_stream_closes_with_the_documented_code(path, code):
    documented = {c["code"] for c in asyncapi()["x-close-codes"]["codes"]}
    stream = WebsocketCommunicator(application, path)
    await stream.connect()

    closing = await stream.receive_output()

    assert closing == {"type": "websocket.close", "code": code}
    assert code in documented
    await stream.disconnect()


def test_the_documented_urls_are_the_routed_ones():
    addresses = {c["address"] for c in asyncapi()["channels"].values()}

    assert addresses == {"/ws/v1/runs/{runId}/", "/ws/v1/approvals/"}


def test_a_developer_finds_the_protocol_from_the_api_docs(caller):
    schema = json.loads(
        Client().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").content
    )
    assert "(/api/docs/websockets/)" in schema["info"]["description"]

    page = Client().get("/api/docs/websockets/")

    assert page.status_code == 200
    html = page.content.decode()
    for name in ("tool_call_start", "tool_call_result", "approval_required", "approval_decided"):
        assert f'id="message-{MESSAGE_KEYS[name]}"' in html
    for code in (4400, 4403, 4404, 4429, 4008, 4011, 4012):
        assert f'id="close-{code}"' in html
    assert "/ws/v1/runs/{runId}/" in html and "?after=" in html
    assert "https://" not in html.replace("https://toolhub.example.com", "")


def test_the_asyncapi_document_is_served_as_yaml():
    response = Client().get("/api/docs/asyncapi.yaml")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    assert response.content.startswith(b"asyncapi: 3.0.0")


def test_the_documented_error_codes_are_the_runners():
    from apps.invocations.models import ErrorCode

    schema = asyncapi()["components"]["schemas"]["toolCallResult"]

    assert schema["properties"]["errorCode"]["enum"] == list(ErrorCode.values)
