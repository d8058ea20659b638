"""A test tool that leaves a trace of every execution, so tests can count real runs,
in this process and in a worker subprocess (TOOLHUB_EXTRA_TOOL_MODULES)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import Redaction, ToolContext, ToolContract, ToolOutput, ToolParams


class Tally(ToolParams):
    path: str = Field(max_length=500)
    token: str = Field(max_length=100)


class Counted(ToolOutput):
    token: str


def tally(params: Tally, ctx: ToolContext, caps: Capabilities) -> Counted:
    """Appends the token to the file: one line per execution."""
    with Path(params.path).open("a", encoding="utf-8") as trace:
        trace.write(params.token + "\n")
    return Counted(token=params.token)


CONTRACTS = [
    ToolContract(
        name="tally",
        description="Test tool tally: records each execution in a file.",
        params=Tally,
        result=Counted,
        execute=tally,
        effect="external_side_effect",
        requires_confirmation=True,
        redaction=Redaction(result=("token",), args=("token",)),
        namespace="test",
    )
]
