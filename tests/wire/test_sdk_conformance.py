"""The golden fixtures against the official SDKs' own types and stream accumulation,
so the shapes toolhub reads and writes cannot drift from the real wire."""

from __future__ import annotations

import contextlib
import json
from typing import Any, get_type_hints

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent, ToolResultBlockParam, ToolUseBlock
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionToolMessageParam,
)
from pydantic import TypeAdapter

from apps.invocations.wire import anthropic, openai
from tests.wire.conftest import fixture_names, load

pytestmark = pytest.mark.one_leg

OPENAI_STREAMS = [n for n in fixture_names("openai") if "chunks" in load(n)["request"]]
WELL_FORMED_OPENAI_STREAMS = ["openai_parallel_stream"]
ANTHROPIC_STREAMS = [n for n in fixture_names("anthropic") if "events" in load(n)["request"]]


def required_keys(typed_dict: Any) -> set[str]:
    return set(typed_dict.__required_keys__)


@pytest.mark.parametrize("name", fixture_names("openai"))
def test_openai_fixture_requests_are_what_the_sdk_reads(name):
    request = load(name)["request"]
    for call in request.get("toolCalls", []):
        ChatCompletionMessageFunctionToolCall.model_validate(call, strict=True)
    for chunk in request.get("chunks", []):
        ChatCompletionChunk.model_validate(chunk)


@pytest.mark.parametrize("name", fixture_names("openai"))
def test_openai_fixture_answers_are_tool_message_params(name):
    adapter = TypeAdapter(ChatCompletionToolMessageParam)
    allowed = set(get_type_hints(ChatCompletionToolMessageParam))
    for message in load(name)["expected"]["messages"]:
        wire = {**message, "content": json.dumps(message["content"])}
        assert required_keys(ChatCompletionToolMessageParam) <= set(wire) <= allowed
        adapter.validate_python(wire)


@pytest.mark.parametrize("name", fixture_names("anthropic"))
def test_anthropic_fixture_requests_are_what_the_sdk_reads(name):
    request = load(name)["request"]
    for block in request.get("content", []):
        if block["type"] == "tool_use":
            ToolUseBlock.model_validate(block)
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in request.get("events", []):
        adapter.validate_python(event)


@pytest.mark.parametrize("name", fixture_names("anthropic"))
def test_anthropic_fixture_answers_are_tool_result_block_params(name):
    adapter = TypeAdapter(ToolResultBlockParam)
    allowed = set(get_type_hints(ToolResultBlockParam))
    for block in load(name)["expected"]["content"]:
        if block["type"] != "tool_result":
            continue
        wire = {**block, "content": json.dumps(block["content"])}
        assert required_keys(ToolResultBlockParam) <= set(wire) <= allowed
        adapter.validate_python(wire)


def sdk_openai_tool_calls(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.current_completion_snapshot.choices[0].message
    return [
        {
            "id": call.id,
            "type": call.type,
            "function": {"name": call.function.name, "arguments": call.function.arguments},
        }
        for call in message.tool_calls or []
    ]


@pytest.mark.parametrize("name", [*WELL_FORMED_OPENAI_STREAMS, "openai_stream_cut"])
def test_openai_delta_assembly_matches_the_sdks_accumulation(name):
    chunks = load(name)["request"]["chunks"]
    assert openai.decode_chunks(chunks).assembled() == sdk_openai_tool_calls(chunks)


def test_openai_assembly_matches_the_sdk_on_one_chunk_with_many_fragments():
    fragments = [
        {
            "index": 0,
            "id": "call_z",
            "type": "function",
            "function": {"name": "a", "arguments": ""},
        },
        {"index": 0, "function": {"arguments": '{"k"'}},
        {"index": 0, "function": {"arguments": ": 1}"}},
    ]
    chunks = [
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": fragments}, "finish_reason": None}],
        }
    ]
    assert openai.decode_chunks(chunks).assembled() == sdk_openai_tool_calls(chunks)


@pytest.mark.parametrize("name", ["anthropic_stream", "anthropic_broken_json"])
def test_anthropic_assembly_matches_the_sdks_accumulation(name):
    events = load(name)["request"]["events"]
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        # The SDK may refuse broken JSON; its buffer still holds the text.
        with contextlib.suppress(ValueError):
            snapshot = accumulate_event(
                event=adapter.validate_python(event), current_snapshot=snapshot, json_bufs=json_bufs
            )
    assert snapshot is not None
    sdk = {
        b.id: json_bufs.get(n, b"").decode() or "{}"
        for n, b in enumerate(snapshot.content)
        if b.type == "tool_use"
    }
    ours = {c.tool_call_id: c.arguments for c in anthropic.decode_events(events).result()}
    assert ours == sdk
