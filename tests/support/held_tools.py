"""A tool held at a barrier another process controls: the cross-process concurrency test.

`test__held` connects to the Unix socket it is given, says `in`, and returns when the
test answers (or the socket closes): the test knows when a call is inside the tool, in
whichever Daphne process runs it, and decides when it leaves. Registered by the test's
own fixture and by Daphne subprocesses through TOOLHUB_EXTRA_TOOL_MODULES.
"""

from __future__ import annotations

import socket

from pydantic import Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Redaction,
    ToolContext,
    ToolContract,
    ToolOutput,
    ToolParams,
    ToolTimedOut,
)

HELD_S = 30.0


class Held(ToolParams):
    socket: str = Field(max_length=100)


class Left(ToolOutput):
    answer: str


def held(params: Held, ctx: ToolContext, caps: Capabilities) -> Left:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as barrier:
        barrier.settimeout(max(0.1, ctx.time_left()))
        barrier.connect(params.socket)
        barrier.sendall(b"in\n")
        try:
            answer = barrier.recv(16)
        except TimeoutError:
            raise ToolTimedOut("The barrier never opened.") from None
    return Left(answer=answer.decode(errors="replace"))


CONTRACTS = [
    ToolContract(
        name="held",
        namespace="test",
        description="Test tool held at a barrier the test opens.",
        params=Held,
        result=Left,
        execute=held,
        effect="read_only",
        redaction=Redaction(result=("answer",), args=()),
        timeout_s=HELD_S,
    )
]
