"""Progress of an imported tool, from its server to the MCP client that called it.

A client of toolhub's /mcp/ that sends `tools/call` with `_meta.progressToken` (and
accepts `text/event-stream`) gets the upstream server's `notifications/progress` for that
call, under its own token, while the call runs. The way there crosses three threads:

- the transport (Daphne's event loop) installs a `Forwarder` in the context it runs the
  method in (`requests.progress_sink`, copied into the method's worker thread);
- the runner hands the sink to the tool's thread (runner._run_tool);
- the MCP source passes it to the upstream session (sessions.Pool.call_tool), whose
  loop thread calls it for each notification; the Forwarder queues it back onto the
  event loop, where the transport writes it to the POST's SSE answer.

A call held for approval runs later (another thread or process) without a sink: its
progress is not forwarded. REST calls never install one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from typing import Any

from apps.invocations.requests import progress_sink
from toolhub.web import json_input

# Notifications waiting for the event loop: a server that reports faster than the client
# reads loses the oldest, never toolhub's memory.
MAX_PENDING = 64


def requested(accept: str | None, body: bytes) -> str | int | None:
    """The progress token of a POST whose one message is a `tools/call` asking for progress,
    from a client that accepts an SSE answer; None otherwise (the answer stays JSON)."""
    if b"progressToken" not in body or "text/event-stream" not in (accept or ""):
        return None
    try:
        message = json_input.loads(body)
    except json_input.JsonInputError:
        return None  # the transport answers the parse error
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    if isinstance(token, bool) or not isinstance(token, str | int):
        return None
    return token


class Forwarder:
    """One call's progress sink, called on any thread, read on the event loop it was
    made on."""

    def __init__(self, token: str | int) -> None:
        self.token = token
        self.loop = asyncio.get_running_loop()
        self.pending: deque[dict[str, Any]] = deque(maxlen=MAX_PENDING)
        self.arrived = asyncio.Event()

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        params: dict[str, Any] = {"progressToken": self.token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        notice = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self.loop.call_soon_threadsafe(self._arrive, notice)

    def _arrive(self, notice: dict[str, Any]) -> None:
        self.pending.append(notice)
        self.arrived.set()

    def context(self) -> contextvars.Context:
        """A copy of the current context with this sink installed, to run the method in."""
        context = contextvars.copy_context()
        context.run(progress_sink.set, self)
        return context

    def take(self) -> list[dict[str, Any]]:
        """Every notification that arrived, oldest first."""
        self.arrived.clear()
        taken = list(self.pending)
        self.pending.clear()
        return taken
