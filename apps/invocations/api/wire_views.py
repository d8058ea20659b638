"""The wire-format batch endpoints: provider tool calls in, provider tool results out."""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.utils import OpenApiResponse, extend_schema
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations.requests import Identifier
from apps.invocations.wire import (
    MalformedRequest,
    Outcome,
    WireCall,
    anthropic,
    openai,
    run_batch,
)
from toolhub.web.api import BadRequest, CallerView, parse_body

_CAMEL = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class _Batch(BaseModel):
    model_config = _CAMEL

    run_id: Identifier | None = Field(
        default=None, description="Run to record the calls under; minted when absent."
    )

    def exactly_one(self, *names: str) -> None:
        given = [name for name in names if getattr(self, name) is not None]
        if len(given) != 1:
            fields = " or ".join(to_camel(name) for name in names)
            raise ValueError(f"give exactly one of {fields}")


class OpenAIToolCallsBatch(_Batch):
    """Complete `toolCalls` (the assistant message's `tool_calls`), or the streamed
    `chunks` (chat.completion.chunk objects, in order) to assemble them from."""

    tool_calls: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    chunks: list[dict[str, Any]] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> OpenAIToolCallsBatch:
        self.exactly_one("tool_calls", "chunks")
        return self


class AnthropicToolUseBatch(_Batch):
    """Complete `content` (the assistant message's content blocks), or the streamed
    `events` (Messages stream events, in order) to assemble the tool_use blocks from."""

    content: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    events: list[dict[str, Any]] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> AnthropicToolUseBatch:
        self.exactly_one("content", "events")
        return self


class OpenAIToolMessage(BaseModel):
    role: Literal["tool"]
    tool_call_id: str
    content: str


class StreamError(BaseModel):
    index: int
    errorCode: str
    safeMessage: str


class CallReceipt(BaseModel):
    toolCallId: str
    invocationId: str
    receipt: str = Field(description="The ended call's signed receipt (docs/receipts.md).")


class OpenAIToolMessages(BaseModel):
    messages: list[OpenAIToolMessage]
    receipts: list[CallReceipt] = Field(
        default_factory=list,
        description="The signed receipts of the calls that ended (a held call has none yet). "
        "Beside the messages, not in them: they are not for the model.",
    )
    errors: list[StreamError] | None = Field(
        default=None, description="Streamed requests only: deltas that belong to no call."
    )


class AnthropicContentBlock(BaseModel):
    type: Literal["tool_result", "text"]
    tool_use_id: str | None = None
    content: str | None = None
    is_error: bool | None = None
    text: str | None = Field(default=None, description="A notice about a stray stream event.")


class AnthropicUserMessage(BaseModel):
    role: Literal["user"]
    content: list[AnthropicContentBlock]


def _receipts(outcomes: list[Outcome]) -> list[dict[str, str]]:
    return [
        {
            "toolCallId": o.tool_call_id,
            "invocationId": str(o.record.pk),
            "receipt": o.record.receipt,
        }
        for o in outcomes
        if o.record is not None and o.record.receipt
    ]


def _parse_calls(decode: Any, items: list[Any]) -> Any:
    try:
        return decode(items)
    except MalformedRequest as exc:
        error = {"field": exc.field, "message": exc.message}
        raise BadRequest("The request is invalid.", [error]) from None


def _nothing_to_run(calls: list[WireCall], strays: int, field: str) -> None:
    if not calls and not strays:
        raise BadRequest(
            "The batch holds no tool call.",
            [{"field": field, "message": "give at least one tool call"}],
        )


class OpenAIToolCallsView(CallerView):
    @extend_schema(
        operation_id="wire_openai_tool_calls",
        summary="Run an OpenAI assistant message's tool calls; answers its tool messages",
        request=OpenAIToolCallsBatch,
        responses={
            200: OpenAIToolMessages,
            400: OpenApiResponse(description="Malformed request, with field errors"),
        },
    )
    def post(self, request: Request) -> Response:
        batch = parse_body(request, OpenAIToolCallsBatch)
        body: dict[str, Any] = {}
        if batch.tool_calls is not None:
            calls = _parse_calls(openai.decode_tool_calls, batch.tool_calls)
            _nothing_to_run(calls, 0, "toolCalls")
        else:
            session = _parse_calls(openai.decode_chunks, batch.chunks or [])
            calls = session.result()
            _nothing_to_run(calls, len(session.orphans), "chunks")
            body["errors"] = [session.orphans[i].as_error() for i in sorted(session.orphans)]
        outcomes = run_batch(self.caller(request), calls, batch.run_id)
        messages = [openai.tool_message(o) for o in outcomes]
        return Response({"messages": messages, "receipts": _receipts(outcomes), **body})


class AnthropicToolUseView(CallerView):
    @extend_schema(
        operation_id="wire_anthropic_tool_use",
        summary="Run an Anthropic assistant message's tool_use blocks; answers the user turn",
        request=AnthropicToolUseBatch,
        responses={
            200: AnthropicUserMessage,
            400: OpenApiResponse(description="Malformed request, with field errors"),
        },
    )
    def post(self, request: Request) -> Response:
        batch = parse_body(request, AnthropicToolUseBatch)
        notices: list[dict[str, Any]] = []
        if batch.content is not None:
            calls = _parse_calls(anthropic.decode_content, batch.content)
            _nothing_to_run(calls, 0, "content")
        else:
            session = _parse_calls(anthropic.decode_events, batch.events or [])
            calls = session.result()
            _nothing_to_run(calls, len(session.orphans), "events")
            notices = [anthropic.orphan_notice(session.orphans[i]) for i in sorted(session.orphans)]
        outcomes = run_batch(self.caller(request), calls, batch.run_id)
        results = [anthropic.tool_result(o) for o in outcomes]
        return Response({"role": "user", "content": results + notices})
