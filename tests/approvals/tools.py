"""A test tool that leaves a trace of every execution, so tests can count real runs,
in this process and in a worker subprocess (TOOLHUB_EXTRA_TOOL_MODULES); and one that
runs inline (it never waits), counting its runs in this process."""

from __future__ import annotations

from collections import Counter
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


class Token(ToolParams):
    token: str = Field(max_length=100)


# test__inline_tally's runs in this process, per token.
INLINE_RUNS: Counter[str] = Counter()


def inline_tally(params: Token, ctx: ToolContext, caps: Capabilities) -> Counted:
    """Counts the token in memory: nothing to wait on, so it may run inline."""
    INLINE_RUNS[params.token] += 1
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
    ),
    ToolContract(
        name="inline_tally",
        description="Test tool inline_tally: counts each execution in memory, inline.",
        params=Token,
        result=Counted,
        execute=inline_tally,
        effect="external_side_effect",
        requires_confirmation=True,
        redaction=Redaction(result=("token",), args=("token",)),
        namespace="test",
        runs_inline=True,
    ),
]
