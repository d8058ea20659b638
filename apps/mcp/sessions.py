"""Long-lived MCP client sessions, pooled per server (and per tenant credential).

One asyncio loop on a daemon thread per process owns every session: the SDK's
transports are async context managers that must be entered and left in the same
task, so each session lives in a task of its own until it is closed. Django code
(the runner's worker threads, sync commands) submits coroutines to that loop and
waits with a deadline; a hanging server costs the caller its timeout, never more.

Starting a session (a stdio process spawned and initialised, an HTTP server's
initialize) has its own bound, START_S, not the caller's: a call whose deadline passes
while the server starts fails alone, and the start goes on for the next call; a sync
waits for the start, then gives the listing the server's timeout.

A session that fails (process exited, connection refused, protocol garbage) is
dropped; the next call starts a fresh one: stdio processes are restarted, HTTP
sessions re-initialised. A stdio process that exits between calls is noticed when its
output ends, so the next call starts it again instead of failing on the old session.
A call that times out (or is cancelled) fails alone: other calls may share its
session, so the session is pinged, and dropped only if the server does not answer
within PING_S (it hangs as a whole, not just that tool).

An HTTP server that lost a session (it restarted, or ended the session) answers the
requests naming it with 404, before it runs them (MCP streamable HTTP, "Session
Management"): the request is sent once more, on a new session. It is the only request
ever sent twice; one the server may have received (the connection broke, the process
died mid-call) fails as `unavailable` and is never re-sent. A 400 is not that signal
(the spec's answer to a request without a session id): the call fails with the
server's message, not re-sent, but the next call starts a new session, for servers
that answer a session they lost with 400.

A remote server's answer is read up to MAX_MESSAGE_BYTES, one JSON body or one SSE
event: a larger one fails its call (AnswerTooLarge) before it is held in memory whole,
and the session serves on. (A stdio server's lines are read by the SDK without such a
bound: stdio servers are programs an admin installed on toolhub's own host.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import anyio
import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from apps.mcp.egress import AddressRefused, guarded_transport

logger = logging.getLogger(__name__)
CREDENTIALS = "it needs credentials (a tenant's connection on the server's page; mcp_sync --tenant)"


# What a call's progress is passed to: (progress, total or None, message or None).
Progress = Callable[[float, float | None, str | None], None]


class ServerUnavailable(Exception):
    """The server could not be reached, started, or answered with something unusable.

    `str()` is for staff (discovery's report, the log); `for_agent` is what a caller of
    the server's tools is told: what they can act on, never how the deployment is run.
    """

    def __init__(self, reason: str, for_agent: str = "") -> None:
        super().__init__(reason)
        self.for_agent = for_agent or reason


class RemoteError(Exception):
    """The server answered a request with a JSON-RPC error: it is alive, the call failed."""


class ServerTimeout(Exception):
    """The server did not answer in time (the session is kept only if it answers a ping)."""


class AnswerTooLarge(RemoteError):
    """The server's answer to this request passed MAX_MESSAGE_BYTES; it was not read whole."""


class ServerBusy(Exception):
    """The server answered a call with HTTP 429 or 503, or with a JSON-RPC error whose
    data carries `retryAfterMs`: it is alive but will not serve this call now.
    `retry_after_ms` is its hint (parse_retry_after), or None."""

    def __init__(self, reason: str, status: int | None, retry_after_ms: int | None) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after_ms = retry_after_ms


class CallCancelled(Exception):
    """The caller's call was cancelled: the request was abandoned (the SDK sends the
    server `notifications/cancelled` for it, or closes its POST on the 2026 wire)."""


class _SessionGone(Exception):
    """The server answered 404 for the session: it did not run the request."""


# One answer of a remote (HTTP) server: a JSON body, or one event of an SSE stream.
MAX_MESSAGE_BYTES = 1024 * 1024
TOO_LARGE = f"the answer is larger than toolhub's limit of {MAX_MESSAGE_BYTES} bytes"
# How the SDK resolves a call whose SSE event passed the limit it was given.
_SDK_EVENT_TOO_LARGE = f"exceeded the {MAX_MESSAGE_BYTES} byte limit"


class _BodyTooLarge(httpx2.StreamError):
    """Raised while a JSON body is read; the SDK answers its call with this text."""


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aiter__(self) -> Any:
        size = 0
        async for chunk in self.inner:
            size += len(chunk)
            if size > MAX_MESSAGE_BYTES:
                raise _BodyTooLarge(TOO_LARGE)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    """Bodies other than SSE streams are cut at MAX_MESSAGE_BYTES (the SDK bounds each
    event of a stream itself, with the same limit): the SDK reads a JSON answer whole."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").lower()
        if not content_type.startswith("text/event-stream"):
            response.stream = _CappedBody(response.stream)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _http_client(headers: dict[str, str], allow_private: bool) -> httpx2.AsyncClient:
    """The SDK's client settings (create_mcp_http_client), with bodies capped and every
    connection through the address guard (egress.py); no redirects, no proxies."""
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=_CappedTransport(guarded_transport(allow_private)),
        follow_redirects=False,
        trust_env=False,
    )


# After a call timed out: how long the server has to answer a ping before its session
# (and every call still waiting on it) is dropped.
PING_S = 2.0
# How long a server has to start: a stdio process to spawn and answer `initialize`, an
# HTTP server to answer `initialize`. The caller's deadline does not cut it short.
START_S = 30.0


@dataclass
class _Attempt:
    """One attempt of one request. The SDK sends a request's POST in its caller's context
    (mcp.shared._context_streams), so the response hook can mark whose request the server
    answered with an HTTP error, and whether it was 404 for the session: that one never
    ran. (An error the server answered is its own, whatever its JSON-RPC code: the SDK
    gives a closed connection -32000 too, a code servers use for errors of their own.)"""

    http_error: int | None = None
    session_gone: bool = False
    retry_after: str | None = None  # the Retry-After header of a 429 or 503


_current_attempt: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "mcp_current_attempt", default=None
)


@dataclass(frozen=True)
class Endpoint:
    """How to reach one server for one set of credentials; the pool's key."""

    server: str
    argv: tuple[str, ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Whose credential the headers are (a tenant's slug, or ""): a list_changed notice
    # re-syncs with the same credential. Not part of the key: the headers are.
    tenant: str = ""
    # A superuser let this server reach private and loopback addresses (egress.py).
    allow_private: bool = False

    @property
    def key(self) -> str:
        raw = json.dumps([self.server, self.argv, self.url, self.headers, self.allow_private])
        return hashlib.sha256(raw.encode()).hexdigest()


class _Session:
    """One live session, owned by its own task on the pool's loop."""

    def __init__(self, endpoint: Endpoint, on_list_changed: Callable[[Endpoint], None]) -> None:
        self.endpoint = endpoint
        self.refused: int | None = None  # an HTTP 401/403 seen while starting
        self.ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.closing = asyncio.Event()
        # Retired: no new call uses it; it closes when the last call on it is done.
        self.retired = False
        self.users = 0
        self._on_list_changed = on_list_changed
        self._stderr: _StderrTail | None = None  # a stdio server's, while it runs
        # Its own context: what the session sends of itself is no call's attempt.
        self.task = asyncio.get_running_loop().create_task(
            self._own(), context=contextvars.Context()
        )
        # A failed start nobody waits for any more is not an unhandled error.
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _own(self) -> None:
        starting = asyncio.timeout(START_S)
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with starting:
                    read, write = await stack.enter_async_context(self._transport())
                    if self._stderr is not None:
                        self._stderr.spawned()
                    session = await stack.enter_async_context(
                        ClientSession(
                            _ReadUntilEnd(read, self.closing), write, message_handler=self._incoming
                        )
                    )
                    await session.initialize()
                self.ready.set_result(session)
                await self.closing.wait()
        except BaseException as exc:  # any failure ends this session only
            if not self.ready.done():
                reason = _describe(exc)
                for_agent = ""
                if self.refused is not None:
                    reason = f"the server refused the request (HTTP {self.refused}): {CREDENTIALS}"
                    for_agent = (
                        "the server refused the request: it needs your tenant's credentials; "
                        "ask a tenant admin to add them"
                    )
                elif starting.expired():
                    reason = f"the server did not start within {START_S:g} s"
                    for_agent = "the server did not start in time"
                    logger.info("MCP server %s: %s", self.endpoint.server, reason)
                else:
                    logger.info("MCP server %s did not start: %r", self.endpoint.server, exc)
                if self._stderr is not None:
                    said = await self._stderr.said()
                    if said:
                        # For staff (the sync's output, the server's last_error), not agents.
                        for_agent = for_agent or reason
                        reason = f"{reason}; its stderr ended with:\n{said}"
                self.ready.set_exception(ServerUnavailable(reason, for_agent))
            if isinstance(exc, asyncio.CancelledError):
                return
        finally:
            self.closing.set()
            if self._stderr is not None:
                self._stderr.close()

    def _transport(self) -> Any:
        endpoint = self.endpoint
        if endpoint.argv:
            params = StdioServerParameters(
                command=program_path(endpoint.argv[0]), args=list(endpoint.argv[1:])
            )
            self._stderr = _StderrTail()
            return stdio_client(params, errlog=self._stderr.writer)
        client = _http_client(dict(endpoint.headers), endpoint.allow_private)
        client.event_hooks["response"].append(self._note_status)
        return _http(endpoint.url, client)

    async def _note_status(self, response: Any) -> None:
        """The SDK turns any HTTP error into one generic message: keep apart a 401/403
        while starting (the server needs credentials), an error answered to a call's POST,
        and a 404 or 400 to a request that named the session (see the module docstring)."""
        status = response.status_code
        if status in (401, 403) and not self.ready.done():
            self.refused = status
        if status < 400 or response.request.method != "POST":
            return
        attempt = _current_attempt.get()
        if attempt is not None:
            attempt.http_error = status
            if status in BUSY:
                attempt.retry_after = response.headers.get("retry-after")
        if status in (400, 404) and _SESSION_HEADER in response.request.headers:
            logger.info("MCP server %s answered %d for its session", self.endpoint.server, status)
            self.retire()
            if attempt is not None and status == 404:
                attempt.session_gone = True

    async def _incoming(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._on_list_changed(self.endpoint)

    @property
    def alive(self) -> bool:
        return not self.closing.is_set() and not self.retired

    def retire(self) -> None:
        """No new call uses this session (the next one starts another)."""
        self.retired = True
        if not self.users:
            self.closing.set()

    def release(self) -> None:
        """A call on this session is done."""
        self.users -= 1
        if self.retired and not self.users:
            self.closing.set()

    async def close(self) -> None:
        self.closing.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.task), 0.2)
        if not self.task.done():
            self.task.cancel()


_SESSION_HEADER = "mcp-session-id"


class _ReadUntilEnd:
    """The transport's read stream, which ends the session when it ends: a stdio server
    that exited (its output closed) is restarted by the next call, instead of that call
    failing on a session that can no longer answer."""

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self.inner = inner
        self.ended = ended

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            item = await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.ended.set()
            raise
        _object_schemas(item)
        return item

    def __aiter__(self) -> _ReadUntilEnd:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _ReadUntilEnd:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _object_schemas(item: Any) -> None:
    """A listed tool whose inputSchema names no type gets `"type": "object"`, in place.

    The SDK refuses a whole `tools/list` answer when one tool's schema lacks it, so one
    tool declared as `inputSchema: {}` (any object, as JSON Schema reads it) made a sync
    fail without naming the tool. toolhub reads such a schema as an object schema anyway
    (apps/mcp/schemas.py); any other problem of a schema stays the tool's own."""
    result = getattr(getattr(item, "message", None), "result", None)
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return
    for tool in tools:
        schema = tool.get("inputSchema") if isinstance(tool, dict) else None
        if isinstance(schema, dict) and "type" not in schema:
            schema["type"] = "object"


@contextlib.asynccontextmanager
async def _http(url: str, client: Any) -> Any:
    async with (
        client,
        streamable_http_client(
            url, http_client=client, max_sse_event_size=MAX_MESSAGE_BYTES
        ) as streams,
    ):
        yield streams


def program_path(name: str) -> str:
    """Where an allowlisted program is: on PATH, else next to toolhub's interpreter.

    The name is a bare one (models.allowed_argv). Programs installed with toolhub
    (`pip install mcp-server-git` into its venv) sit beside the interpreter, which is
    not on PATH when a command is run as `.venv/bin/python manage.py ...`; looking
    there finds them without widening the allowlist (still names, never paths).
    """
    own_bin = os.path.dirname(sys.executable)  # the venv's bin, symlinks not followed
    found = shutil.which(name) or shutil.which(name, path=own_bin)
    if found is None:
        raise ServerUnavailable(f"the program {name!r} was not found on PATH nor in {own_bin}")
    return found


# What is kept of a stdio server's stderr: its last characters, shown to staff when the
# server fails to start (a wrong argument, a missing repository), never to agents.
STDERR_TAIL_CHARS = 1000
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[^\S\n]+|[\x00-\x09\x0b-\x1f\x7f]")


class _StderrTail:
    """A pipe for a stdio server's stderr, drained on the pool's loop for as long as the
    process runs (a full pipe would block it); only the last bytes are kept."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self.writer = os.fdopen(write_fd, "w")
        self._read_fd: int | None = read_fd
        self._tail = bytearray()
        self._ended = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(read_fd, self._drain)

    def _drain(self) -> None:
        if self._read_fd is None:
            return
        try:
            chunk = os.read(self._read_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._stop_reading()
            return
        self._tail += chunk
        del self._tail[: -4 * STDERR_TAIL_CHARS]

    def _stop_reading(self) -> None:
        if self._read_fd is not None:
            self._loop.remove_reader(self._read_fd)
            os.close(self._read_fd)
            self._read_fd = None
        self._ended.set()

    def spawned(self) -> None:
        """The process has its copy of the pipe: ours is closed, so its exit ends it."""
        self.writer.close()

    async def said(self) -> str:
        """The tail of what the process wrote (awaiting its end, briefly), scrubbed of
        control characters and cut to STDERR_TAIL_CHARS."""
        self.spawned()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), 1.0)
        text = self._tail.decode("utf-8", errors="replace")
        text = _CONTROL.sub(lambda m: " " if m.group().isspace() else "", text).strip()
        return text[-STDERR_TAIL_CHARS:]

    def close(self) -> None:
        self.writer.close()
        self._stop_reading()


# HTTP statuses that mean "not now": rate limited, or unavailable for a while.
BUSY = (429, 503)
# A hint is capped at an hour (the runner's MAX_RETRY_AFTER_MS): a larger one is no
# promise a caller should plan on.
MAX_RETRY_AFTER_MS = 3_600_000
_DELAY_SECONDS = re.compile(r"\d+")


def parse_retry_after(value: str | None, now: datetime | None = None) -> int | None:
    """A Retry-After header (RFC 9110 10.2.3: delay-seconds or an HTTP-date) in ms, capped
    at MAX_RETRY_AFTER_MS; a date already past is 0. None when absent or malformed
    (a negative number, a fraction, words, a date without a zone): ignored."""
    if value is None:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        seconds = int(value) if len(value) <= 10 else MAX_RETRY_AFTER_MS  # more: an age
        return min(seconds * 1000, MAX_RETRY_AFTER_MS)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    left = (when - (now or datetime.now(UTC))).total_seconds()
    return int(min(max(left, 0) * 1000, MAX_RETRY_AFTER_MS))


def _hinted_ms(data: Any) -> int | None:
    """`retryAfterMs` of a JSON-RPC error's data: a finite number >= 0, capped."""
    hint = data.get("retryAfterMs") if isinstance(data, dict) else None
    if isinstance(hint, bool) or not isinstance(hint, int | float) or not 0 <= hint < math.inf:
        return None
    return int(min(hint, MAX_RETRY_AFTER_MS))


def _busy(exc: MCPError, attempt: _Attempt) -> ServerBusy | None:
    """The call's failure as ServerBusy when the server said "not now" (see ServerBusy)."""
    if attempt.http_error in BUSY:
        status = attempt.http_error
        reason = "rate limited" if status == 429 else "temporarily unavailable"
        return ServerBusy(
            f"the server is {reason} (HTTP {status})",
            status,
            parse_retry_after(attempt.retry_after),
        )
    if attempt.http_error is None:
        hint = _hinted_ms(exc.data)
        if hint is not None:
            return ServerBusy(exc.message[:500], None, hint)
    return None


def _describe(exc: BaseException) -> str:
    """A short, value-free reason: the exception type, and its text for our own errors."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, AddressRefused):
        return f"the server cannot be reached: {exc}"
    if isinstance(exc, FileNotFoundError):
        return "the server's program was not found"
    if isinstance(exc, OSError | ConnectionError):
        return "the server could not be reached"
    if isinstance(exc, ServerUnavailable):
        return str(exc)
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "the server closed the connection"
    # The client library's own exception types say nothing a caller can act on.
    return "the session failed"


class Pool:
    """Sessions keyed by endpoint, on one loop thread started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[str, _Session] = {}
        self._checks: set[asyncio.Task[None]] = set()  # pings after a timeout (kept alive)
        self.list_changed: Callable[[Endpoint], None] = lambda endpoint: None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or not self._loop.is_running():
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                threading.Thread(target=run, name="toolhub-mcp", daemon=True).start()
                started.wait(5)
                self._loop = loop
            return self._loop

    def submit(self, coroutine: Awaitable[Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(_as_coroutine(coroutine), self._ensure_loop())

    def run(self, make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        """Run a coroutine on the loop and wait at most `timeout` seconds."""
        future = self.submit(make())
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise ServerTimeout from None

    def _live(self, endpoint: Endpoint) -> _Session:
        """The endpoint's session, started now if there is none fit for a new call."""
        live = self._sessions.get(endpoint.key)
        if live is None or not live.alive:
            live = _Session(endpoint, self._list_changed)
            self._sessions[endpoint.key] = live
        return live

    async def _started(self, live: _Session) -> ClientSession:
        """`live`'s session once started (a start bounded by START_S)."""
        try:
            return await asyncio.shield(live.ready)
        except ServerUnavailable:
            self._forget(live)
            raise

    def _list_changed(self, endpoint: Endpoint) -> None:
        threading.Thread(target=self.list_changed, args=(endpoint,), daemon=True).start()

    def _forget(self, live: _Session) -> None:
        """Take `live` out of the pool (unless another session already replaced it)."""
        if self._sessions.get(live.endpoint.key) is live:
            del self._sessions[live.endpoint.key]

    async def _drop(self, live: _Session) -> None:
        self._forget(live)
        await live.close()

    async def _guarded(self, endpoint: Endpoint, action: Callable[[ClientSession], Any]) -> Any:
        """`action` on a live session, sent a second time only if the server refused the
        first for a session it no longer has (404, before running it). A failure drops
        the session; a cancellation (a timeout) only if the server does not answer a ping
        either, and a start still under way goes on under its own bound."""
        try:
            return await self._once(endpoint, action)
        except _SessionGone:
            logger.info("MCP server %s lost the session; sending again", endpoint.server)
        try:
            return await self._once(endpoint, action)
        except _SessionGone:
            raise ServerUnavailable("the server ended the new session too") from None

    async def _once(self, endpoint: Endpoint, action: Callable[[ClientSession], Any]) -> Any:
        live = self._live(endpoint)
        live.users += 1
        attempt = _Attempt()
        token = _current_attempt.set(attempt)  # the POSTs sent for `action` carry it
        session: ClientSession | None = None
        try:
            session = await self._started(live)
            return await action(session)
        except ServerUnavailable:
            raise
        except asyncio.CancelledError:
            if session is not None and not attempt.session_gone:
                self._check_later(live, session)
            raise
        except Exception as exc:
            if attempt.session_gone:
                raise _SessionGone from None  # whatever the SDK made of the 404
            if isinstance(exc, MCPError):
                if TOO_LARGE in exc.message or _SDK_EVENT_TOO_LARGE in exc.message:
                    raise AnswerTooLarge(TOO_LARGE) from None  # only this call's answer: no drop
                busy = _busy(exc, attempt)
                if busy is not None:
                    raise busy from None  # the server is alive: no drop
                if exc.code != CONNECTION_CLOSED or attempt.http_error is not None:
                    raise RemoteError(exc.message[:500]) from None
                await self._drop(live)
                raise ServerUnavailable("the connection closed") from None
            await self._drop(live)
            logger.info("MCP server %s failed: %r", endpoint.server, exc)
            raise ServerUnavailable(_describe(exc)) from None
        finally:
            _current_attempt.reset(token)
            live.release()

    def _check_later(self, live: _Session, session: ClientSession) -> None:
        """After one call timed out: keep the session for the calls that share it if the
        server still answers, else drop it (a hung server, or a stdio process stuck)."""
        if self._sessions.get(live.endpoint.key) is not live:
            return  # already replaced

        async def check() -> None:
            try:
                await asyncio.wait_for(session.send_ping(), PING_S)
            except Exception:
                if self._sessions.get(live.endpoint.key) is live:
                    logger.info(
                        "MCP server %s did not answer a ping; restarting", live.endpoint.server
                    )
                    await self._drop(live)

        task = asyncio.get_running_loop().create_task(check(), context=contextvars.Context())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def list_tools(self, endpoint: Endpoint, timeout: float) -> list[types.Tool]:
        """Every tool the server lists, within `timeout` once it runs (a server that must
        start first has START_S for that). A listing sent again on a new session starts
        from its first page: a cursor means nothing to another session."""

        async def listing(session: ClientSession) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            for _page in range(100):
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                result = await session.list_tools(params=params)
                tools += result.tools
                cursor = result.next_cursor
                if not cursor:
                    break
            return tools

        return self._run_guarded(endpoint, listing, timeout, start_counts=False)

    def call_tool(
        self,
        endpoint: Endpoint,
        name: str,
        arguments: dict[str, Any],
        timeout: float,
        cancelled: Callable[[], bool] = lambda: False,
        on_progress: Progress | None = None,
    ) -> types.CallToolResult:
        """The tool's result within `timeout`, the caller's deadline, start included. With
        `on_progress`, the call asks the server for progress (the SDK's own progressToken)
        and each `notifications/progress` for it is passed on, on the pool's loop: the
        callback must not block."""

        async def report(progress: float, total: float | None, message: str | None) -> None:
            assert on_progress is not None
            try:
                on_progress(progress, total, message)
            except Exception:  # the caller's business: the call goes on
                logger.exception("progress callback failed")

        async def calling(session: ClientSession) -> types.CallToolResult:
            return await session.call_tool(
                name, arguments, progress_callback=report if on_progress else None
            )

        return self._run_guarded(endpoint, calling, timeout, cancelled=cancelled)

    def _run_guarded(
        self,
        endpoint: Endpoint,
        action: Callable[[ClientSession], Any],
        timeout: float,
        cancelled: Callable[[], bool] = lambda: False,
        start_counts: bool = True,
    ) -> Any:
        future = self.submit(self._bounded(endpoint, action, timeout, start_counts))
        while True:
            try:
                return future.result(timeout=0.1)
            except FutureTimeout:
                if cancelled():
                    # The task is cancelled: the SDK tells the server (notifications/
                    # cancelled, or the request's POST closed) and the session is pinged.
                    future.cancel()
                    raise CallCancelled from None

    async def _bounded(
        self,
        endpoint: Endpoint,
        action: Callable[[ClientSession], Any],
        timeout: float,
        start_counts: bool,
    ) -> Any:
        if not start_counts:
            await self._started(self._live(endpoint))  # bounded by START_S, not `timeout`
        try:
            return await asyncio.wait_for(self._guarded(endpoint, action), timeout)
        except TimeoutError:
            raise ServerTimeout from None

    def close_all(self) -> None:
        """Drop every session (tests; a process about to exit)."""
        self.close_server(None)

    def close_server(self, server: str | None) -> None:
        """Drop every session of `server` (its settings changed, or it was removed)."""

        async def closing() -> None:
            for key, live in list(self._sessions.items()):
                if server is None or live.endpoint.server == server:
                    self._sessions.pop(key, None)
                    await live.close()

        with contextlib.suppress(Exception):
            self.run(closing, timeout=5)


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


pool = Pool()
