"""Typed answers. The wire messages themselves stay plain dicts: they go straight back
into the provider's conversation, so they keep the provider's exact shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Held:
    """A call that waits for a person: it has not run yet."""

    approval_id: str
    invocation_id: str


@dataclass(frozen=True)
class ToolResult:
    """One call's answer as the model will read it (`content`), and what it means."""

    tool_call_id: str
    content: str
    is_error: bool
    held: Held | None = None
    error_code: str | None = None
    safe_message: str | None = None
    invocation_id: str | None = None

    @classmethod
    def parse(cls, tool_call_id: str, content: str, is_error: bool) -> ToolResult:
        """Reads toolhub's documented content: a held notice, an error, or the result."""
        try:
            data = json.loads(content)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("status") == "pending_approval":
            held = Held(str(data["approvalId"]), str(data["invocationId"]))
            return cls(tool_call_id, content, False, held=held, invocation_id=held.invocation_id)
        if is_error and isinstance(data, dict):
            return cls(
                tool_call_id,
                content,
                True,
                error_code=data.get("errorCode"),
                safe_message=data.get("safeMessage"),
                invocation_id=data.get("invocationId"),
            )
        return cls(tool_call_id, content, is_error)

    @property
    def value(self) -> Any:
        """The tool's result, decoded (None for errors and held calls)."""
        return None if self.is_error or self.held else json.loads(self.content)


@dataclass(frozen=True)
class Invocation:
    """An invocation record (`GET /api/v1/invocations/{id}/`)."""

    invocation_id: str
    tool_call_id: str
    run_id: str
    tool_id: str
    status: str
    ok: bool | None = None
    result: Any = None
    error_code: str | None = None
    safe_message: str | None = None
    approval_id: str | None = None
    retry_after_ms: int | None = None
    retry_of: str | None = None  # the failed call this one retried (same idempotency key)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Invocation:
        return cls(
            invocation_id=data["invocationId"],
            tool_call_id=data["toolCallId"],
            run_id=data["runId"],
            tool_id=data["toolId"],
            status=data["status"],
            ok=data.get("ok"),
            result=data.get("result"),
            error_code=data.get("errorCode"),
            safe_message=data.get("safeMessage"),
            approval_id=data.get("approvalId"),
            retry_after_ms=data.get("retryAfterMs"),
            retry_of=data.get("retryOf"),
        )

    def tool_result(self) -> ToolResult:
        """The content toolhub's wire endpoints give a finished call (see docs/api-notes.md)."""
        if self.ok is True:
            content = _dumps(self.result)
            return ToolResult(self.tool_call_id, content, False, invocation_id=self.invocation_id)
        error = {
            "ok": False,
            "errorCode": self.error_code,
            "safeMessage": self.safe_message,
            "invocationId": self.invocation_id,
        }
        return ToolResult.parse(self.tool_call_id, _dumps(error), True)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class OpenAIBatch:
    """The answer to a batch of OpenAI tool calls: `messages` to append to the chat."""

    run_id: str
    messages: list[dict[str, Any]]
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def results(self) -> list[ToolResult]:
        return [
            ToolResult.parse(m["tool_call_id"], m["content"], _is_error(m["content"]))
            for m in self.messages
        ]

    @property
    def held(self) -> list[ToolResult]:
        return [r for r in self.results if r.held]


@dataclass
class AnthropicBatch:
    """The answer to a batch of Anthropic tool_use blocks: `message`, the next user turn."""

    run_id: str
    message: dict[str, Any]

    @property
    def results(self) -> list[ToolResult]:
        return [
            ToolResult.parse(b["tool_use_id"], b["content"], b["is_error"])
            for b in self.message["content"]
            if b.get("type") == "tool_result"
        ]

    @property
    def held(self) -> list[ToolResult]:
        return [r for r in self.results if r.held]


def _is_error(content: str) -> bool:
    """OpenAI tool messages have no error flag; toolhub's failure content says `ok: false`."""
    try:
        data = json.loads(content)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("ok") is False and "errorCode" in data
