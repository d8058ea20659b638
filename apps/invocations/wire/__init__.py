"""Wire-format batches: provider tool calls in, provider tool results out.

WIRE_FORMATS_ARE_ADAPTERS: the decoders in `openai` and `anthropic` turn what a
model sent (complete calls, or a stream of deltas assembled by one decode
session, DECODER_ASSEMBLES_TOOLCALLS) into `WireCall`s; `run_batch` sends each
one through the runner, in order, under one run id; the encoders turn the
outcomes back into the provider's result shape.

A call the wire layer itself cannot hand to the runner (its id is too long or
repeated, the stream was cut inside it, the batch is over its size) carries a
`Problem` and is answered without running or being recorded: a duplicate id
would give two records one id, a cut call's arguments are not what the model
meant, and neither may run. Everything else, including arguments that are not
JSON, goes to the runner, which records the outcome (`invalid_json`, ...).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from apps.invocations import runner
from apps.invocations.models import ErrorCode, InvocationRecord, Status
from apps.invocations.requests import MAX_TOOL_CALL_ID, InvocationRequest
from apps.tenants.callers import Caller

MAX_BATCH_CALLS = 32
"""Calls one batch may run; calls past it are answered with a `validation` error."""

MAX_TOOL_NAME = 200


@dataclass(frozen=True)
class Problem:
    """Why the wire layer answers a call itself: an error code and a safe message."""

    code: ErrorCode
    safe_message: str


CUT_MID_CALL = Problem(
    ErrorCode.INVALID_JSON,
    "The stream ended before this tool call was complete, so it did not run.",
)


@dataclass(frozen=True)
class WireCall:
    """One decoded tool call. `arguments` is JSON text (parsed by the runner, so
    text that is not JSON becomes a recorded `invalid_json` result)."""

    tool_call_id: str
    name: str
    arguments: str
    problem: Problem | None = None


@dataclass(frozen=True)
class Outcome:
    """What one call ended as: a runner record, or a problem the wire layer answered."""

    tool_call_id: str
    record: InvocationRecord | None = None
    problem: Problem | None = None

    @property
    def is_error(self) -> bool:
        if self.record is None:
            return True
        return self.record.status != Status.PENDING_APPROVAL and self.record.ok is not True

    def content(self) -> str:
        """The text the model reads: the result itself, an error, or a held notice."""
        if self.problem is not None:
            return _dumps(
                {
                    "ok": False,
                    "errorCode": self.problem.code,
                    "safeMessage": self.problem.safe_message,
                }
            )
        record = self.record
        assert record is not None
        if record.status == Status.PENDING_APPROVAL:
            approval = getattr(record, "approval", None)
            return _dumps(
                {
                    "status": "pending_approval",
                    "message": "This call is awaiting approval by a person and has not run yet.",
                    "approvalId": str(approval.pk) if approval is not None else None,
                    "invocationId": str(record.pk),
                }
            )
        if record.ok is True:
            return _dumps(record.result)
        return _dumps(
            {
                "ok": False,
                "errorCode": record.error_code,
                "safeMessage": record.safe_message,
                "invocationId": str(record.pk),
            }
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def wire_problem(call: WireCall, seen: set[str], position: int) -> Problem | None:
    """The checks a call must pass before the runner may see it, in batch order."""
    if call.problem is not None:
        return call.problem
    if position >= MAX_BATCH_CALLS:
        return Problem(
            ErrorCode.VALIDATION,
            f"A batch holds at most {MAX_BATCH_CALLS} tool calls; this one did not run.",
        )
    if len(call.tool_call_id) > MAX_TOOL_CALL_ID:
        return Problem(
            ErrorCode.VALIDATION,
            f"The tool call id is longer than {MAX_TOOL_CALL_ID} characters; the call did not run.",
        )
    if call.tool_call_id in seen:
        return Problem(
            ErrorCode.VALIDATION,
            "An earlier call in this batch has the same tool call id; this one did not run.",
        )
    if not call.name or len(call.name) > MAX_TOOL_NAME:
        return Problem(ErrorCode.UNAVAILABLE, "The tool call names no known tool.")
    return None


def run_batch(caller: Caller, calls: list[WireCall], run_id: str | None) -> list[Outcome]:
    """Every call through the runner, in order, under one run id (minted if not given)."""
    run_id = run_id or f"run_{uuid.uuid4().hex}"
    seen: set[str] = set()
    outcomes = []
    for position, call in enumerate(calls):
        problem = wire_problem(call, seen, position)
        seen.add(call.tool_call_id)
        if problem is not None:
            outcomes.append(Outcome(call.tool_call_id, problem=problem))
            continue
        try:
            request = InvocationRequest(
                tool_id=call.name,
                arguments=call.arguments,
                tool_call_id=call.tool_call_id,
                run_id=run_id,
            )
        except ValidationError:
            problem = Problem(ErrorCode.VALIDATION, "The tool call is malformed; it did not run.")
            outcomes.append(Outcome(call.tool_call_id, problem=problem))
            continue
        outcomes.append(Outcome(call.tool_call_id, record=runner.invoke(caller, request)))
    return outcomes


class MalformedRequest(ValueError):
    """The posted calls, chunks or events are not provider shapes at all: a 400 naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
