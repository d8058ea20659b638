"""Tools that exist only for tests: they make the runner's edge cases happen on demand.

Registered by the `test_tools` fixture in-process, and by a Daphne subprocess
through TOOLHUB_EXTRA_TOOL_MODULES=tests.support.tools.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Redaction,
    ToolContext,
    ToolContract,
    ToolError,
    ToolOutput,
    ToolParams,
    ToolTimedOut,
    ToolUnavailable,
)

BARRIER_PARTIES = 5
_barrier = threading.Barrier(BARRIER_PARTIES)


class NoParams(ToolParams):
    pass


class Echo(ToolParams):
    text: str = Field(max_length=10000)
    secret_note: str = ""


class EchoOut(ToolOutput):
    text: str
    secret_note: str = ""


class Sleep(ToolParams):
    seconds: float = Field(ge=0, le=60)


class Size(ToolParams):
    size: int = Field(ge=0, le=10_000_000)


class Waited(ToolOutput):
    waited: int


class CountedWait(ToolParams):
    path: str = Field(max_length=500)
    token: str = Field(max_length=100)
    ms: int = Field(ge=0, le=4000)


class Tallied(ToolOutput):
    token: str
    executions: int


class Blob(ToolOutput):
    blob: str


def wait_for_peers(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    """Returns only once BARRIER_PARTIES calls are inside tools at the same time."""
    try:
        index = _barrier.wait(timeout=10)
    except threading.BrokenBarrierError:
        _barrier.reset()
        raise ToolError("Not every concurrent call reached the barrier in time.") from None
    return Waited(waited=index)


def echo(params: Echo, ctx: ToolContext, caps: Capabilities) -> EchoOut:
    return EchoOut(text=params.text, secret_note=params.secret_note)


def sleep(params: Sleep, ctx: ToolContext, caps: Capabilities) -> Waited:
    ctx.wait_cancelled(params.seconds)
    return Waited(waited=int(params.seconds))


def counted_wait(params: CountedWait, ctx: ToolContext, caps: Capabilities) -> Tallied:
    """Appends the token to the file (one line per execution), then takes `ms` to finish."""
    with Path(params.path).open("a", encoding="utf-8") as trace:
        trace.write(params.token + "\n")
    ctx.wait_cancelled(params.ms / 1000)
    lines = Path(params.path).read_text(encoding="utf-8").splitlines()
    return Tallied(token=params.token, executions=lines.count(params.token))


def noop(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    return Waited(waited=0)


def crash(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    raise RuntimeError("internal detail: password=hunter2 at /srv/app.py line 12")


def refuse_politely(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    raise ToolError("The upstream service said no.")


def provider_timed_out(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    """A provider's own wait ran out first (as an MCP session's does at the deadline)."""
    raise ToolTimedOut("The provider did not answer in time.")


def wrong_output(params: NoParams, ctx: ToolContext, caps: Capabilities) -> dict[str, object]:
    return {"waited": "not a number"}


def big_output(params: Size, ctx: ToolContext, caps: Capabilities) -> Blob:
    return Blob(blob="x" * params.size)


class Where(ToolOutput):
    thread: str


class Fail(ToolParams):
    how: Literal["refuse", "crash", "timed_out"]


def where(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Where:
    """Names the thread the runner ran it on."""
    return Where(thread=threading.current_thread().name)


def overrun(params: NoParams, ctx: ToolContext, caps: Capabilities) -> Waited:
    """Computes past its deadline without waiting on anything (a tool that runs inline
    and is slower than it declared)."""
    end = time.monotonic() + 0.15
    while time.monotonic() < end:
        pass
    return Waited(waited=150)


def fail(params: Fail, ctx: ToolContext, caps: Capabilities) -> Waited:
    if params.how == "refuse":
        raise ToolError("The inline tool said no.")
    if params.how == "timed_out":
        raise ToolTimedOut("The provider did not answer in time.")
    raise RuntimeError("internal detail: password=hunter2")


class Flaky(ToolParams):
    path: str = Field(max_length=500)
    token: str = Field(max_length=100)
    failures: int = Field(ge=0, le=10)
    retry_after_ms: int | None = None


def flaky(params: Flaky, ctx: ToolContext, caps: Capabilities) -> Tallied:
    """Appends the token (one line per attempt); its first `failures` attempts find the
    upstream down, with `retry_after_ms` as the upstream's hint."""
    with Path(params.path).open("a", encoding="utf-8") as trace:
        trace.write(params.token + "\n")
    tries = Path(params.path).read_text(encoding="utf-8").splitlines().count(params.token)
    if tries <= params.failures:
        raise ToolUnavailable("The upstream is down.", retry_after_ms=params.retry_after_ms)
    return Tallied(token=params.token, executions=tries)


def _test_tool(
    name: str, params: type[ToolParams], result: type[ToolOutput], execute: object, **kw: object
) -> ToolContract:
    return ToolContract(
        name=name,
        description=f"Test tool {name}.",
        params=params,
        result=result,
        execute=execute,  # type: ignore[arg-type]
        effect=kw.pop("effect", "read_only"),  # type: ignore[arg-type]
        redaction=kw.pop("redaction", Redaction(result=tuple(result.model_fields), args=())),  # type: ignore[arg-type]
        namespace="test",
        **kw,  # type: ignore[arg-type]
    )


CONTRACTS = [
    _test_tool("barrier", NoParams, Waited, wait_for_peers, timeout_s=20),
    _test_tool("echo", Echo, EchoOut, echo, redaction=Redaction(result=("text",), args=("text",))),
    _test_tool("sleep", Sleep, Waited, sleep, timeout_s=0.5),
    _test_tool("counted_wait", CountedWait, Tallied, counted_wait, timeout_s=5),
    _test_tool("crash", NoParams, Waited, crash),
    _test_tool("refuse", NoParams, Waited, refuse_politely),
    _test_tool("provider_timeout", NoParams, Waited, provider_timed_out, timeout_s=0.5),
    _test_tool("wrong_output", NoParams, Waited, wrong_output),
    _test_tool("big_output", Size, Blob, big_output),
    _test_tool(
        "confirm",
        NoParams,
        Waited,
        noop,
        requires_confirmation=True,
        effect="external_side_effect",
        runs_inline=True,
    ),
    _test_tool("where", NoParams, Where, where),
    _test_tool("inline_where", NoParams, Where, where, runs_inline=True),
    _test_tool("inline_overrun", NoParams, Waited, overrun, runs_inline=True, timeout_s=0.05),
    _test_tool("inline_fail", Fail, Waited, fail, runs_inline=True),
    _test_tool("flaky", Flaky, Tallied, flaky),
    _test_tool("flaky_send", Flaky, Tallied, flaky, effect="external_side_effect"),
]
