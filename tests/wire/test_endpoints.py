"""The two batch endpoints: golden fixtures end to end, and each kind of bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord, Status
from apps.invocations.wire import MAX_BATCH_CALLS
from apps.receipts import verification
from tests.conftest import Agent
from tests.support.deep_json import TOO_DEEP, deep_texts, logged_tracebacks
from tests.wire.conftest import ANTHROPIC, OPENAI, assert_shape, fixture_names, load

pytestmark = pytest.mark.django_db


def post(agent: Agent, url: str, body: Any) -> Any:
    return agent.client.post(url, body, format="json")


def echo(call_id: str, text: str = "hi", name: str = "test__echo") -> dict[str, Any]:
    args = json.dumps({"text": text})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def contents(response: Any) -> list[Any]:
    return [json.loads(m["content"]) for m in response.json()["messages"]]


@pytest.mark.parametrize("name", fixture_names("openai"))
def test_openai_answers_match_the_golden_fixture(wire_agent, name):
    """The messages as API.md gives them, byte for byte in shape; beside them (issue 48) a
    signed receipt for each call that ended, naming its tool call, which verifies."""
    fixture = load(name)
    response = post(wire_agent, OPENAI, fixture["request"])
    assert response.status_code == 200, response.json()
    body = response.json()
    receipts = body.pop("receipts")
    assert_shape(fixture["expected"], body)
    ids = [m["tool_call_id"] for m in body["messages"]]
    # Every recorded call that ended (a held one has no receipt until it ends; a call cut
    # off by the stream never ran and has no record).
    recorded = InvocationRecord.objects.filter(tool_call_id__in=ids).exclude(
        status__in=[Status.PENDING_APPROVAL, Status.QUEUED, Status.RUNNING]
    )
    ended = [i for i in ids if i in set(recorded.values_list("tool_call_id", flat=True))]
    assert ended, "no call of the fixture ended: nothing shows the receipts"
    assert [r["toolCallId"] for r in receipts] == ended, body["messages"]
    published = wire_agent.client.get("/.well-known/jwks.json").json()
    for receipt in receipts:
        signed = verification.verify(receipt["receipt"], published)
        assert signed["invocationId"] == receipt["invocationId"], signed


@pytest.mark.parametrize("name", fixture_names("anthropic"))
def test_anthropic_answers_match_the_golden_fixture(wire_agent, name):
    fixture = load(name)
    response = post(wire_agent, ANTHROPIC, fixture["request"])
    assert response.status_code == 200, response.json()
    assert_shape(fixture["expected"], response.json())


def test_it_runs_the_batch_in_order_under_one_run_with_the_models_ids(wire_agent):
    body = {"runId": "run-wire-1", "toolCalls": [echo("call_1", "a"), echo("call_2", "b")]}
    response = post(wire_agent, OPENAI, body)
    assert [m["tool_call_id"] for m in response.json()["messages"]] == ["call_1", "call_2"]
    records = InvocationRecord.objects.filter(run_id="run-wire-1").order_by("created_at")
    assert [(r.tool_call_id, r.status) for r in records] == [
        ("call_1", Status.SUCCEEDED),
        ("call_2", Status.SUCCEEDED),
    ]


def test_it_mints_one_run_id_shared_by_the_batch(wire_agent):
    post(wire_agent, ANTHROPIC, load("anthropic_single")["request"] | {"content": [
        {"type": "tool_use", "id": "toolu_1", "name": "test__echo", "input": {"text": "a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "test__echo", "input": {"text": "b"}},
    ]})  # fmt: skip
    runs = set(InvocationRecord.objects.values_list("run_id", flat=True))
    assert len(runs) == 1 and next(iter(runs)).startswith("run_")


def test_a_held_call_names_its_approval_and_invocation(wire_agent):
    response = post(wire_agent, OPENAI, load("openai_multiple")["request"])
    held = contents(response)[1]
    record = InvocationRecord.objects.get(tool_call_id="call_m2")
    assert record.status == Status.PENDING_APPROVAL
    assert held["invocationId"] == str(record.pk)
    assert held["approvalId"] == str(record.approval.pk)
    assert "awaiting approval" in held["message"]


def test_broken_json_gets_invalid_json_without_echoing_the_raw_text(wire_agent):
    for url, name in ((OPENAI, "openai_broken_json"), (ANTHROPIC, "anthropic_broken_json")):
        response = post(wire_agent, url, load(name)["request"])
        assert "SECRET-RAW-TEXT" not in json.dumps(response.json())
    assert InvocationRecord.objects.filter(error_code="invalid_json").count() == 2


def test_a_failing_tool_is_an_anthropic_error_result(wire_agent):
    content = [{"type": "tool_use", "id": "toolu_x", "name": "test__crash", "input": {}}]
    result = post(wire_agent, ANTHROPIC, {"content": content}).json()["content"][0]
    assert result["is_error"] is True
    assert json.loads(result["content"])["errorCode"] == "execution"
    assert "hunter2" not in result["content"]


# ---------------------------------------------------------------- bad input, one test each


def test_an_unknown_tool_name_is_unavailable_and_the_rest_runs(wire_agent):
    response = post(wire_agent, OPENAI, {"toolCalls": [echo("c1", name="core__nope"), echo("c2")]})
    first, second = contents(response)
    assert first["errorCode"] == "unavailable" and "core__nope" in first["safeMessage"]
    assert second == {"text": "hi"}


def test_a_duplicate_tool_call_id_runs_once_and_the_rest_runs(wire_agent):
    calls = [echo("dup", "first"), echo("dup", "second"), echo("other", "third")]
    first, second, third = contents(post(wire_agent, OPENAI, {"toolCalls": calls}))
    assert first == {"text": "first"}
    assert second["errorCode"] == "validation" and "same tool call id" in second["safeMessage"]
    assert third == {"text": "third"}
    assert InvocationRecord.objects.filter(tool_call_id="dup").count() == 1


def test_an_id_over_128_characters_is_refused_and_the_rest_runs(wire_agent):
    long_id = "toolu_" + "x" * 123
    content = [
        {"type": "tool_use", "id": long_id, "name": "test__echo", "input": {"text": "a"}},
        {"type": "tool_use", "id": "toolu_ok", "name": "test__echo", "input": {"text": "b"}},
    ]
    first, second = post(wire_agent, ANTHROPIC, {"content": content}).json()["content"]
    assert first["tool_use_id"] == long_id and first["is_error"] is True
    assert "128" in json.loads(first["content"])["safeMessage"]
    assert second["is_error"] is False
    assert not InvocationRecord.objects.filter(tool_call_id=long_id).exists()


def test_an_id_of_exactly_128_characters_runs(wire_agent):
    exact = "c" * 128
    (message,) = contents(post(wire_agent, OPENAI, {"toolCalls": [echo(exact)]}))
    assert message == {"text": "hi"}


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "42", "null"])
def test_json_arguments_that_are_not_an_object_are_refused_and_the_rest_runs(wire_agent, arguments):
    bad = {
        "id": "c1",
        "type": "function",
        "function": {"name": "test__echo", "arguments": arguments},
    }
    first, second = contents(post(wire_agent, OPENAI, {"toolCalls": [bad, echo("c2")]}))
    assert first["errorCode"] == "validation" and "object" in first["safeMessage"]
    assert second == {"text": "hi"}


def test_an_anthropic_input_that_is_not_an_object_is_refused(wire_agent):
    content = [{"type": "tool_use", "id": "toolu_1", "name": "test__echo", "input": ["a"]}]
    result = post(wire_agent, ANTHROPIC, {"content": content}).json()["content"][0]
    assert json.loads(result["content"])["errorCode"] == "validation"


@deep_texts
def test_arguments_nested_too_deeply_are_invalid_json_and_the_rest_runs(wire_agent, text, caplog):
    bad = {"id": "c1", "type": "function", "function": {"name": "test__echo", "arguments": text}}
    first, second = contents(post(wire_agent, OPENAI, {"toolCalls": [bad, echo("c2")]}))
    assert first["errorCode"] == "invalid_json"
    assert first["safeMessage"] == f"The tool arguments are refused. {TOO_DEEP}"
    assert second == {"text": "hi"}
    assert logged_tracebacks(caplog) == []


@deep_texts
def test_a_streamed_input_nested_too_deeply_is_invalid_json(wire_agent, text):
    events = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "test__echo"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": text},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    (result,) = post(wire_agent, ANTHROPIC, {"events": events}).json()["content"]
    assert result["is_error"] is True
    assert json.loads(result["content"])["safeMessage"].endswith(TOO_DEEP)


def test_a_stream_that_ends_mid_call_does_not_run_that_call(wire_agent):
    response = post(wire_agent, OPENAI, load("openai_stream_cut")["request"])
    first, second = contents(response)
    assert first == {"text": "done"}
    assert second["errorCode"] == "invalid_json" and "stream ended" in second["safeMessage"]
    assert not InvocationRecord.objects.filter(tool_call_id="call_c1").exists()


def test_an_anthropic_stream_that_ends_mid_block_does_not_run_it(wire_agent):
    post(wire_agent, ANTHROPIC, load("anthropic_stream_cut")["request"])
    assert InvocationRecord.objects.filter(tool_call_id="toolu_c0").exists()
    assert not InvocationRecord.objects.filter(tool_call_id="toolu_c1").exists()


def test_a_delta_for_an_index_never_opened_is_reported_and_the_rest_runs(wire_agent):
    body = post(wire_agent, OPENAI, load("openai_stream_orphan")["request"]).json()
    assert [e["index"] for e in body["errors"]] == [3]
    assert json.loads(body["messages"][0]["content"]) == {"text": "kept"}
    assert not InvocationRecord.objects.filter(args__text="lost").exists()


def test_an_anthropic_event_for_a_block_never_started_is_told_to_the_model(wire_agent):
    content = post(wire_agent, ANTHROPIC, load("anthropic_stream_orphan")["request"]).json()[
        "content"
    ]
    assert content[0]["is_error"] is False
    assert content[1]["type"] == "text" and "content block 4" in content[1]["text"]


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (OPENAI, {"toolCalls": []}, "toolCalls"),
        (OPENAI, {"chunks": []}, "chunks"),
        (ANTHROPIC, {"content": []}, "content"),
        (ANTHROPIC, {"content": [{"type": "text", "text": "no calls"}]}, "content"),
    ],
)
def test_an_empty_batch_is_a_request_error(wire_agent, url, body, field):
    response = post(wire_agent, url, body)
    assert response.status_code == 400
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert not InvocationRecord.objects.exists()


def test_a_batch_over_the_documented_size_runs_only_the_first_calls(wire_agent):
    calls = [echo(f"call_{n}") for n in range(MAX_BATCH_CALLS + 2)]
    messages = contents(post(wire_agent, OPENAI, {"toolCalls": calls}))
    assert messages[:MAX_BATCH_CALLS] == [{"text": "hi"}] * MAX_BATCH_CALLS
    for late in messages[MAX_BATCH_CALLS:]:
        assert late["errorCode"] == "validation"
        assert str(MAX_BATCH_CALLS) in late["safeMessage"]
    assert InvocationRecord.objects.count() == MAX_BATCH_CALLS


# ---------------------------------------------------------------- request errors


@deep_texts
def test_a_body_nested_too_deeply_is_a_400_saying_so(wire_agent, text, caplog):
    for url in (OPENAI, ANTHROPIC):
        response = wire_agent.client.post(url, data=text, content_type="application/json")
        assert response.status_code == 400
        assert response.json() == {"detail": TOO_DEEP}
    assert not InvocationRecord.objects.exists()
    assert logged_tracebacks(caplog) == []


def test_it_wants_exactly_one_form_of_calls(wire_agent):
    body = {"toolCalls": [echo("a")], "chunks": [{"choices": []}]}
    assert post(wire_agent, OPENAI, body).status_code == 400
    assert post(wire_agent, ANTHROPIC, {"runId": "r"}).status_code == 400


def test_a_complete_call_without_an_id_is_a_request_error(wire_agent):
    call = {"type": "function", "function": {"name": "test__echo", "arguments": "{}"}}
    response = post(wire_agent, OPENAI, {"toolCalls": [call]})
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "toolCalls.0.id"


def test_it_refuses_anonymous_callers(db):
    assert APIClient().post(OPENAI, {"toolCalls": [echo("a")]}, format="json").status_code == 401
    assert APIClient().post(ANTHROPIC, {"content": []}, format="json").status_code == 401


def test_another_tenants_policy_does_not_apply(wire_agent, bare_agent):
    (message,) = contents(post(bare_agent, OPENAI, {"toolCalls": [echo("a")]}))
    assert message["errorCode"] == "policy_denied"


def test_each_request_is_its_own_decode_session(wire_agent):
    opening = load("openai_stream_cut")["request"]["chunks"][:1]
    post(wire_agent, OPENAI, {"chunks": opening})
    rest = [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {
        "arguments": '{"text": "more"}'}}]}, "finish_reason": "tool_calls"}]}]  # fmt: skip
    body = post(wire_agent, OPENAI, {"chunks": rest}).json()
    assert body["messages"] == []
    assert [e["index"] for e in body["errors"]] == [0]
