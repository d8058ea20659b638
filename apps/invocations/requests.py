"""The invocation request every entry point builds before calling the runner."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

MAX_TOOL_CALL_ID = 128
# Both limits count bytes of compact UTF-8 JSON, so a call's size does not depend on how
# its client spaced it. Args: checked at step 5 (recorded as validation) and on an
# approver's edit (InvalidEdit, 400). Result: the validated result before redaction, or
# less if a policy's budget says so (recorded as result_too_large).
MAX_ARGS_BYTES = 8 * 1024
MAX_RESULT_BYTES = 32 * 1024

# Progress of the call being invoked, (progress, total or None, message or None): set by
# an entry point whose caller can receive it (toolhub's MCP server, for a tools/call with
# `_meta.progressToken`) around runner.invoke; the runner hands it to the tool's thread,
# where a tool source may report to it (apps/mcp/source.py). Not part of the request: a
# call held for approval runs later, elsewhere, without it.
ProgressSink = Callable[[float, float | None, str | None], None]
progress_sink: ContextVar[ProgressSink | None] = ContextVar("toolhub_progress", default=None)

Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")
]


class InvocationRequest(BaseModel):
    """`args` is the parsed object; `arguments` is the model's raw JSON text.

    Exactly one of them may be given (neither means no arguments). `arguments`
    is parsed by the runner so that text that is not JSON becomes a recorded
    `invalid_json` result rather than a request error.
    """

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )

    tool_id: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] | None = None
    arguments: str | None = Field(default=None, max_length=1024 * 1024)
    tool_call_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOOL_CALL_ID)] | None
    ) = None
    run_id: Identifier | None = None
    connection_id: str | None = Field(default=None, max_length=64)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _one_kind_of_arguments(self) -> InvocationRequest:
        if self.args is not None and self.arguments is not None:
            raise ValueError("give either args (an object) or arguments (JSON text), not both")
        return self
