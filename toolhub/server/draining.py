"""A stopping server finishes the requests it is serving, refuses new ones, then exits.

On SIGTERM Daphne cancels every request's task, waits for those tasks, then stops the event
loop. A cancelled task does not stop its request's thread: the view runs on, and a call's
events are sent on the loop (apps/invocations/events.py). Once the loop had stopped, such a
thread waited for it forever, and the process, which joins its threads at exit, never
exited: under load, SIGTERM left Daphne running until it was killed, and the calls in
flight lost their answers and their events.

`Draining` wraps the HTTP application. A request cancelled from outside (the server
stopping, or Daphne giving up on a client gone for `application_close_timeout`) finishes
first: its thread's work, and its answer if its client is still connected; then it ends
as served. A second cancellation leaves it. Once the server has begun to stop
(`install_daphne_drain`: Twisted's "before shutdown", ahead of Daphne's own), a new request
is answered 503 with Retry-After and `Connection: close` at once, without Django, so that
the load balancer sends it elsewhere and no new work starts on a loop about to stop.

A request that only waits, on the loop, for something to happen (an MCP event stream, an
MCP `tasks/result` waiting for a held call's decision) would hold the stop for as long as
its client stays. Such waits end when the server stops (`on_stop`, `is_stopping`): the
stream is closed and its client reconnects elsewhere.

WebSocket streams get a close frame first: code 4012 (CLOSE_RESTARTING, the private
twin of 1012 "service restart", which Daphne cannot send) and a reason saying to
reconnect elsewhere; the stop waits for them to close (at most CLOSE_WAIT_S) before
the reactor drops what is left. A stream opened meanwhile is closed the same way.
`/healthz` and `/readyz` are still answered (toolhub/ops/health.py): 200, and 503 from the
moment the stop began.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from toolhub.server.limits import ASGIApp, Receive, Scope, Send, send_json

RETRY_AFTER_S = 1
CLOSE_RESTARTING = 4012
RESTART_REASON = "server restarting: reconnect, to another server, with ?after=<last seq>"
CLOSE_WAIT_S = 5.0  # how long a stop waits for its streams to close

_stopping = False  # this process's server has begun to stop
_on_stop: set[Callable[[], Awaitable[None] | None]] = set()


def is_stopping() -> bool:
    return _stopping


def on_stop(callback: Callable[[], Awaitable[None] | None]) -> Callable[[], None]:
    """Call `callback` (on the loop) when the server begins to stop, at once if it has;
    returns what forgets it. For requests that only wait, which would hold the stop, and
    for work the process does besides requests: what `callback` returns, if anything, is
    waited for before the process exits (the embedded worker's current call)."""
    if _stopping:
        callback()
    else:
        _on_stop.add(callback)
    return lambda: _on_stop.discard(callback)


_REFUSED = json.dumps(
    {
        "detail": f"The server is restarting; retry in {RETRY_AFTER_S} seconds.",
        "retryAfterSeconds": RETRY_AFTER_S,
    }
).encode()


class Draining:
    def __init__(self, app: ASGIApp, open_while_stopping: tuple[str, ...] = ()) -> None:
        """`open_while_stopping`: paths `app` still answers once the stop began (the
        health probes), served and waited for as any other request."""
        self.app = app
        self.open_while_stopping = open_while_stopping
        self.serving = 0
        self._drained: asyncio.Future[None] | None = None

    def stop(self) -> asyncio.Future[Any]:
        """The server is stopping: refuse what comes next; done once every request being
        served, and whatever `on_stop` callbacks returned, has ended."""
        global _stopping
        _stopping = True
        waits = []
        for callback in list(_on_stop):
            _on_stop.discard(callback)
            if (wait := callback()) is not None:
                waits.append(wait)
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
            if not self.serving:
                self._drained.set_result(None)
        return asyncio.gather(self._drained, *waits) if waits else self._drained

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if _stopping and scope.get("path") not in self.open_while_stopping:
            await refuse(send)
            return
        self.serving += 1
        try:
            served = asyncio.ensure_future(self.app(scope, receive, send))
            try:
                await asyncio.shield(served)
            except asyncio.CancelledError:
                await asyncio.shield(served)  # its thread may still need this loop
                # Finished: end as a request that was served. Daphne waits for its
                # cancelled requests with one gather, which ends at the first of them to
                # end cancelled and lets the loop stop under the others.
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
        finally:
            self.serving -= 1
            if not self.serving and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)


async def refuse_stream(receive: Receive, send: Send) -> None:
    """A WebSocket opened while the server stops: accepted, then closed as the open ones."""
    if (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_RESTARTING, "reason": RESTART_REASON})


def refusing_streams_when_stopping(app: ASGIApp) -> ASGIApp:
    async def streams(scope: Scope, receive: Receive, send: Send) -> None:
        if _stopping:
            await refuse_stream(receive, send)
        else:
            await app(scope, receive, send)

    return streams


async def refuse(send: Send) -> None:
    await send_json(send, 503, _REFUSED, ((b"retry-after", str(RETRY_AFTER_S).encode()),))


def install_daphne_drain(draining: Draining) -> None:
    """Tell `draining` when Daphne's server begins to stop: Twisted runs "before shutdown"
    triggers in the order they were added, and this one is added when the application is
    imported, before Daphne adds its own (the one that cancels every request). A no-op
    where Daphne's reactor is not installed (another server, the test suite's own)."""
    import sys

    if "daphne.server" not in sys.modules:
        return
    from twisted.internet import defer, reactor

    from toolhub.server.daphne_frames import close_streams

    async def stopped(drained: Awaitable[Any], closed: asyncio.Future[None]) -> None:
        with contextlib.suppress(TimeoutError):  # the reactor drops what is left
            await asyncio.wait_for(asyncio.shield(closed), CLOSE_WAIT_S)
        await drained

    def stopping() -> Any:
        # Runs before Daphne cancels the consumers; Twisted waits for what it returns.
        drained = draining.stop()
        closed = close_streams(CLOSE_RESTARTING, RESTART_REASON)
        return defer.Deferred.fromFuture(asyncio.ensure_future(stopped(drained, closed)))

    trigger: Any = reactor
    trigger.addSystemEventTrigger("before", "shutdown", stopping)
