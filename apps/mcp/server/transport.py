"""`/mcp/`: the streamable HTTP transport, as a plain ASGI app inside toolhub's router.

POST carries one JSON-RPC message and gets `application/json` back (a response, or
202 for a notification). GET opens a server-to-client event stream that carries
`notifications/tools/list_changed`. DELETE is 405 (see sessions.py). Every request
presents an API key or an OAuth access token (`Authorization: Bearer`, else 401 with
the challenge of apps/oauth/resource.py) and, after `initialize`,
the `Mcp-Session-Id` it was given. A request whose `MCP-Protocol-Version` is
2026-07-28 is stateless (`stateless`, modern.py): POST only, no session, its
`subscriptions/listen` answered with the same kind of stream as GET. The body
limit of toolhub.server.limits applies as for every HTTP request: the router sits inside
`BodyLimitMiddleware`, and Daphne's request class refuses oversized bodies before
this app is called.

The methods run synchronously (the runner is synchronous) in a worker thread per
request, never on the event loop; the event loop only reads bodies and streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from apps.invocations.fanout import feeds_for
from apps.invocations.revocations import key_watch
from apps.invocations.streams import connection_slots
from apps.mcp import progress
from apps.mcp.server import methods, modern
from apps.mcp.server.methods import RpcError
from apps.mcp.server.notifications import groups_for
from apps.mcp.server.sessions import Session
from apps.oauth import bearer
from apps.oauth.resource import Refusal, challenge, resource_for
from apps.tenants.callers import Caller
from apps.tenants.models import ApiKey
from toolhub.server import draining
from toolhub.server.limits import Receive, Scope, Send
from toolhub.web import json_input
from toolhub.web.ws_auth import allowed_host, allowed_origin

logger = logging.getLogger(__name__)

SESSION_HEADER = b"mcp-session-id"
VERSION_HEADER = b"mcp-protocol-version"
# A comment line on idle streams, so proxies keep them open and a gone client is noticed.
KEEPALIVE_S = 15.0
# Messages in one 2025-03-26 batch: each may run a tool, and the request holds until all end.
MAX_BATCH = 32


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


def rpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1")).strip()
    return None


class McpEndpoint:
    """The ASGI app for `/mcp/`."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if not allowed_host(scope):
            # DNS rebinding without an Origin (a non-browser client, or a browser that
            # sent none): a name that is not this server's may not reach it.
            await _send(send, _refusal(421, "This Host may not use /mcp/."))
            return
        origin = _header(scope, b"origin")
        if origin is not None and not allowed_origin(scope, origin):
            # DNS rebinding: a page of another site must not reach a local server.
            await _send(send, _refusal(403, "This Origin may not use /mcp/."))
            return
        key = await _authenticate(scope)
        if isinstance(key, Reply):
            await _send(send, key)
            return
        version = _header(scope, VERSION_HEADER)
        if version == modern.VERSION:
            await self.stateless(scope, receive, send, key)
            return
        if version is not None and version not in methods.PROTOCOL_VERSIONS:
            # -32022 with the versions served: a client probing a newer revision retries
            # with 2026-07-28 (a 2025 client reads a 400 either way).
            detail = f"Unsupported MCP-Protocol-Version; use one of {modern.SUPPORTED_VERSIONS}."
            error = RpcError(modern.UNSUPPORTED_VERSION, detail, modern.unsupported(version))
            await _send(send, _modern_error(None, error))
            return
        if method == "POST":
            body = await _read_body(receive)
            if body is None:
                return  # the client went away (or the body limit cut it off)
            token = progress.requested(_header(scope, b"accept"), body)
            if token is not None:  # a tools/call asking for progress (apps/mcp/progress.py)
                await _with_progress(
                    send, progress.Forwarder(token), self.post, scope, receive, key, body
                )
                return
            await _send(send, await self.post(scope, receive, key, body))
        elif method == "GET":
            await self.stream(scope, receive, send, key)
        else:
            allow = b"GET, POST"
            reason = "Clients cannot end sessions here; a session ends with its key or expires."
            if method != "DELETE":
                reason = "Use POST for messages and GET for the event stream."
            await _send(send, _refusal(405, reason, ((b"allow", allow),)))

    async def post(self, scope: Scope, receive: Receive, key: ApiKey, body: bytes) -> Reply:
        try:
            message = json_input.loads(body)
        except json_input.JsonInputError as exc:
            return Reply(400, rpc_error(None, methods.PARSE_ERROR, f"Parse error. {exc}"))
        if isinstance(message, list):
            return await self.batch(scope, receive, key, message)
        return await self.one(scope, receive, key, message)

    async def batch(self, scope: Scope, receive: Receive, key: ApiKey, batch: list[Any]) -> Reply:
        """A JSON-RPC batch, in a session of the one revision that has them (2025-03-26):
        each message answered as if sent alone, in order; the answers in one array (202
        when there is none: only notifications). `initialize` may not be batched."""
        session_id = _header(scope, SESSION_HEADER)
        session = Session.find(session_id, key.pk) if session_id else None
        if session is None or session.protocol_version != methods.BATCH_VERSION:
            detail = (
                "Send one message per request (batches are part of protocol "
                f"{methods.BATCH_VERSION} only, in a session that negotiated it)."
            )
            return Reply(400, rpc_error(None, methods.INVALID_REQUEST, detail))
        if not batch or len(batch) > MAX_BATCH:
            detail = f"A batch holds 1 to {MAX_BATCH} messages."
            return Reply(400, rpc_error(None, methods.INVALID_REQUEST, detail))
        answers = []
        for message in batch:
            if isinstance(message, dict) and message.get("method") == "initialize":
                detail = "initialize may not be part of a batch."
                answers.append(rpc_error(message.get("id"), methods.INVALID_REQUEST, detail))
                continue
            reply = await self.one(scope, receive, key, message)
            if reply.body is not None:
                answers.append(reply.body)
        return Reply(200, answers) if answers else Reply(202)

    async def one(self, scope: Scope, receive: Receive, key: ApiKey, message: Any) -> Reply:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return Reply(
                400, rpc_error(None, methods.INVALID_REQUEST, "Not a JSON-RPC 2.0 message.")
            )
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "initialize" and "id" in message:
            if not isinstance(params, dict):
                return _error(request_id, methods.INVALID_PARAMS, "params must be an object.")
            try:
                named = _run_headers(scope)  # per-run narrowing: reads the database
                run_id = await _session_run(key, named) if named else None
                result, started = methods.initialize(key.pk, params, run_id)
            except RpcError as exc:
                return _error(request_id, exc.code, exc.message)
            reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
            return Reply(200, reply, ((SESSION_HEADER, started.id.encode()),))
        session_id = _header(scope, SESSION_HEADER)
        if session_id is None:
            return _sessionless(request_id, params)
        session = Session.find(session_id, key.pk)
        if session is None:
            return _error(
                request_id, methods.INVALID_REQUEST, "Unknown or expired session.", status=404
            )
        if not isinstance(method, str) or "id" not in message:
            return Reply(202)  # a notification or a response to us: nothing to answer
        if not isinstance(params, dict):
            return _error(request_id, methods.INVALID_PARAMS, "params must be an object.")
        try:
            if method == "tasks/result" and session.protocol_version == methods.TASKS_VERSION:
                result = await _await_task(key, params, receive)
            else:
                traceparent = _header(scope, b"traceparent")
                result = await _answer(key, session, method, params, traceparent)
        except RpcError as exc:
            return _error(request_id, exc.code, exc.message)
        return Reply(200, {"jsonrpc": "2.0", "id": request_id, "result": result})

    async def stream(self, scope: Scope, receive: Receive, send: Send, key: ApiKey) -> None:
        session_id = _header(scope, SESSION_HEADER)
        if session_id is None:
            reply = _error(None, methods.INVALID_REQUEST, "Missing Mcp-Session-Id header.", 400)
            await _send(send, reply)
            return
        if Session.find(session_id, key.pk) is None:
            reply = _error(None, methods.INVALID_REQUEST, "Unknown or expired session.", status=404)
            await _send(send, reply)
            return
        if "text/event-stream" not in (_header(scope, b"accept") or ""):
            await _send(send, _refusal(406, "Accept text/event-stream for this stream."))
            return
        await _open(EventStream(key, send), receive)

    async def stateless(self, scope: Scope, receive: Receive, send: Send, key: ApiKey) -> None:
        """A 2026-07-28 request: one JSON-RPC request per POST, checked against its routing
        headers before anything runs; errors carry the revision's HTTP statuses."""
        if scope["method"] != "POST":
            detail = f"Protocol {modern.VERSION} uses POST only (subscriptions/listen streams)."
            await _send(send, _refusal(405, detail, ((b"allow", b"POST"),)))
            return
        body = await _read_body(receive)
        if body is None:
            return
        try:
            message = json_input.loads(body)
        except json_input.JsonInputError as exc:
            error = RpcError(methods.PARSE_ERROR, f"Parse error. {exc}")
            await _send(send, _modern_error(None, error))
            return
        if isinstance(message, list):
            detail = (
                f"Protocol {modern.VERSION} takes one JSON-RPC request per POST; batches are "
                f"part of {methods.BATCH_VERSION} only. Nothing in this batch was run."
            )
            await _send(send, _modern_error(None, RpcError(methods.INVALID_REQUEST, detail)))
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            error = RpcError(methods.INVALID_REQUEST, "Not a JSON-RPC 2.0 message.")
            await _send(send, _modern_error(None, error))
            return
        request_id, method = message.get("id"), message.get("method")
        if "id" not in message:
            await _send(send, Reply(202))  # a notification: this revision defines none to act on
            return
        headers = _routing_headers(scope)
        try:
            if not isinstance(method, str) or not isinstance(message.get("params"), dict):
                raise RpcError(methods.INVALID_REQUEST, "A request has a method and params object.")
            if headers is None:
                raise RpcError(modern.HEADER_MISMATCH, "A routing header appears more than once.")
            meta = modern.envelope(message, headers)
            if method == "subscriptions/listen":
                await self.listen(scope, receive, send, key, request_id, meta, message["params"])
                return
        except RpcError as exc:
            await _send(send, _modern_error(request_id, exc))
            return
        params, traceparent = message["params"], _header(scope, b"traceparent")
        answer = (key, meta, method, params, headers, traceparent, request_id)
        token = progress.requested(_header(scope, b"accept"), body)
        if token is not None:  # a tools/call asking for progress, as in the older revisions
            await _with_progress(send, progress.Forwarder(token), _modern_reply, *answer)
            return
        await _send(send, await _modern_reply(*answer))

    async def listen(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: ApiKey,
        request_id: Any,
        meta: dict[str, Any],
        params: dict[str, Any],
    ) -> None:
        """`subscriptions/listen`: acknowledged with what is honored (tools/list_changed;
        task ids are not pushed: tasks are polled), then list_changed until the client
        leaves, the key is revoked, or the server stops (then the result ends it)."""
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise RpcError(methods.INVALID_PARAMS, "params.notifications must be an object.")
        if wanted.get("taskIds") and not modern.declares_tasks(meta):
            raise modern.missing_tasks_capability()
        if "text/event-stream" not in (_header(scope, b"accept") or ""):
            await _send(send, _refusal(406, "Accept text/event-stream for subscriptions/listen."))
            return
        honored = {"toolsListChanged": True} if wanted.get("toolsListChanged") is True else {}
        await _open(ListenStream(key, send, request_id, honored), receive)


class EventStream:
    """One GET stream: list_changed notifications until the client leaves or the key is revoked."""

    def __init__(self, key: ApiKey, send: Send) -> None:
        self.key, self.send = key, send
        # Only "list again" travels here: one pending notice says all a full queue would.
        self.pending: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self.ended = asyncio.Event()
        self.stopped = False

    async def offer(self, event: dict[str, Any], text: str) -> None:
        self._queue(f"event: message\ndata: {text}\n\n".encode())

    async def catch_up(self) -> None:
        """The layer failed and notices may be lost: tell the client to list again."""
        self._queue(b"event: message\ndata: " + json.dumps(NOTICE).encode() + b"\n\n")

    async def key_revoked(self) -> None:
        self.ended.set()

    def _queue(self, frame: bytes) -> None:
        if self.pending.empty():
            self.pending.put_nowait(frame)

    async def run(self, receive: Receive) -> None:
        layer = get_channel_layer()
        groups = groups_for(self.key.tenant_id)
        await self.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        await self._write(b": toolhub mcp stream\n\n")
        watch = key_watch()
        await watch.watch(self.key.pk, self)
        # The server stopping ends the stream, as it closes WebSockets: the client
        # reconnects to another process (toolhub/server/draining.py).
        forget = draining.on_stop(self._stopping)
        subscribed: list[str] = []
        try:
            for group in groups:
                await feeds_for(layer).subscribe(layer, group, self)
                subscribed.append(group)
            await self.opened()
            await self._pump(receive)
        finally:
            for group in subscribed:
                await feeds_for(layer).unsubscribe(group, self)
            await watch.unwatch(self.key.pk, self)
            forget()
            with contextlib.suppress(Exception):  # the client may be gone already
                await self.closing()
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    def _stopping(self) -> None:
        self.stopped = True
        self.ended.set()

    async def opened(self) -> None:
        """Written once the stream hears changes (a listen stream's acknowledgement)."""

    async def closing(self) -> None:
        """Written last, when the stream ends (a listen stream's result if the server stops)."""

    async def _pump(self, receive: Receive) -> None:
        gone = asyncio.ensure_future(_disconnected(receive))
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            while not gone.done() and not ended.done():
                notice = asyncio.ensure_future(self.pending.get())
                await asyncio.wait(
                    {gone, ended, notice}, timeout=KEEPALIVE_S, return_when="FIRST_COMPLETED"
                )
                if notice.done():
                    await self._write(notice.result())
                else:
                    notice.cancel()
                    if not gone.done() and not ended.done():
                        await self._write(b": keepalive\n\n")
        finally:
            gone.cancel()
            ended.cancel()

    async def _write(self, frame: bytes) -> None:
        await self.send({"type": "http.response.body", "body": frame, "more_body": True})


class ListenStream(EventStream):
    """A 2026-07-28 `subscriptions/listen` stream: every notification names its
    subscription (the listen request's id), and a stopping server ends it with the
    request's result, so the client knows to listen again elsewhere."""

    def __init__(self, key: ApiKey, send: Send, request_id: Any, honored: dict[str, Any]) -> None:
        super().__init__(key, send)
        self.request_id, self.honored = request_id, honored
        self.meta = {modern.SUBSCRIPTION_KEY: request_id}

    async def offer(self, event: dict[str, Any], text: str) -> None:
        if self.honored.get("toolsListChanged"):
            notice = {**NOTICE, "params": {"_meta": self.meta}}
            self._queue(b"event: message\ndata: " + json.dumps(notice).encode() + b"\n\n")

    async def catch_up(self) -> None:
        await self.offer({}, "")

    async def opened(self) -> None:
        ack = {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": self.honored, "_meta": self.meta},
        }
        await self._write(b"event: message\ndata: " + json.dumps(ack).encode() + b"\n\n")

    async def closing(self) -> None:
        if self.stopped:
            result = modern.complete({}, self.meta)
            end = {"jsonrpc": "2.0", "id": self.request_id, "result": result}
            await self._write(b"event: message\ndata: " + json.dumps(end).encode() + b"\n\n")


NOTICE = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
RESTARTING = "The server is restarting: ask for this task's result again."


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _await_task(key: ApiKey, params: dict[str, Any], receive: Receive) -> Any:
    """`tasks/result` blocks until the call ends (e.g. a held call is decided).

    It waits here, on the event loop, re-reading the record every poll interval, so a
    wait of minutes holds no thread; it stops when the client goes away, and when the
    server stops (the client asks again, of another process: toolhub/server/draining.py).
    """
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        while True:
            result = await _task_result(key, params)
            if result is not None or gone.done():
                return result
            if draining.is_stopping():
                raise RpcError(methods.INTERNAL_ERROR, RESTARTING)
            await asyncio.wait({gone}, timeout=methods.TASK_POLL_MS / 1000)
    finally:
        gone.cancel()


async def _open(stream: EventStream, receive: Receive) -> None:
    """Run a stream within the principal's budget of open streams (WebSockets and MCP
    streams alike), or refuse it with 429."""
    key = stream.key
    slot = await connection_slots.acquire(f"{key.tenant_id}:{key.principal}")
    if slot is None:
        detail = "Too many open streams for this principal; close one first."
        await _send(stream.send, _refusal(429, detail, ((b"retry-after", b"5"),)))
        return
    try:
        await stream.run(receive)
    finally:
        await slot.release()


def _sessionless(request_id: Any, params: Any) -> Reply:
    """A request (not initialize) with no session: a 2026-07-28 body without its header,
    or no protocol version at all; either is told what to send."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and modern.VERSION_KEY in meta:
        detail = (
            "The MCP-Protocol-Version header does not match params._meta's protocol version "
            f"(a {modern.VERSION} request sends both)."
        )
        return _error(request_id, modern.HEADER_MISMATCH, detail, status=400)
    detail = (
        "No protocol version: send MCP-Protocol-Version and params._meta"
        f"['{modern.VERSION_KEY}'] ({modern.VERSION}), or initialize a session "
        f"({', '.join(methods.PROTOCOL_VERSIONS)}) and send its Mcp-Session-Id."
    )
    return _error(request_id, methods.INVALID_REQUEST, detail, status=400)


def _routing_headers(scope: Scope) -> dict[str, str] | None:
    """The request's headers by lowercase name, None when a routing header (version,
    method, name) appears twice: readers of the first and the last copy would disagree."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        if name in headers and name in ("mcp-protocol-version", "mcp-method", "mcp-name"):
            return None
        headers[name] = raw_value.decode("latin-1").strip()
    return headers


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _key_for(scope: Scope) -> ApiKey | Reply:
    """The API key the request acts as (its own, or the one an OAuth token acts through),
    or the refusal: 401/403 with the challenge that leads OAuth clients to the metadata."""
    resource = resource_for(scope.get("scheme", "http"), _header(scope, b"host") or "")
    try:
        return bearer.key_for(_header(scope, b"authorization"), resource)
    except Refusal as refusal:
        challenge_header = ((b"www-authenticate", challenge(refusal, resource).encode()),)
        if refusal.status == 503:  # the issuer's keys could not be read: not the token's fault
            return _refusal(refusal.status, refusal.description)
        message = refusal.description
        if refusal.status == 401 and refusal.error:  # what is wanted, then what was wrong
            message = f"{bearer.MISSING} {refusal.description}"
        return _refusal(refusal.status, message, challenge_header)


def _run_headers(scope: Scope) -> dict[str, str]:
    """The per-run narrowing headers a request carries (methods.session_run)."""
    wanted = (methods.RUN_HEADER.encode(), methods.TOOLS_HEADER.encode())
    return {
        name.lower().decode(): value.decode("latin-1").strip()
        for name, value in scope.get("headers", [])
        if name.lower() in wanted
    }


def _start_session_run(key: ApiKey, headers: dict[str, str]) -> str | None:
    return methods.session_run(Caller.for_api_key(key), headers)


def _run(
    key: ApiKey, session: Session, method: str, params: dict[str, Any], traceparent: str | None
) -> Any:
    return methods.answer(Caller.for_api_key(key), session, method, params, traceparent)


def _run_modern(
    key: ApiKey,
    meta: dict[str, Any],
    method: str,
    params: dict[str, Any],
    headers: dict[str, str],
    traceparent: str | None,
) -> Any:
    if method == "tools/call":
        modern.check_param_headers(params, headers)
    caller = Caller.for_api_key(key)
    result = modern.answer(caller, meta, method, params, traceparent, headers)
    return result if result.get("resultType") == "task" else modern.complete(result)


# Worker threads (not the one thread "thread-sensitive" code shares), with the database
# connection handling of channels.db, so a slow tool never holds up another request.
_authenticate = database_sync_to_async(_key_for, thread_sensitive=False)
_answer = database_sync_to_async(_run, thread_sensitive=False)
_session_run = database_sync_to_async(_start_session_run, thread_sensitive=False)
_answer_modern = database_sync_to_async(_run_modern, thread_sensitive=False)


def _finished_task(key: ApiKey, params: dict[str, Any]) -> Any:
    return methods.task_result(Caller.for_api_key(key), params)


_task_result = database_sync_to_async(_finished_task, thread_sensitive=False)


def _refusal(status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    """A refusal by the transport, its body a JSON-RPC error so MCP clients show the message."""
    return Reply(status, rpc_error(None, methods.INVALID_REQUEST, message), headers)


async def _modern_reply(
    key: ApiKey,
    meta: dict[str, Any],
    method: str,
    params: dict[str, Any],
    headers: dict[str, str],
    traceparent: str | None,
    request_id: Any,
) -> Reply:
    """A 2026-07-28 request's answer, or its error with the revision's HTTP status."""
    try:
        result = await _answer_modern(key, meta, method, params, headers, traceparent)
    except RpcError as exc:
        return _modern_error(request_id, exc)
    return Reply(200, {"jsonrpc": "2.0", "id": request_id, "result": result})


def _modern_error(request_id: Any, exc: RpcError) -> Reply:
    """A 2026-07-28 error: its HTTP status follows its code (modern.HTTP_STATUS)."""
    body = rpc_error(request_id, exc.code, exc.message)
    if exc.data is not None:
        body["error"]["data"] = exc.data
    return Reply(modern.HTTP_STATUS.get(exc.code, 200), body)


def _error(request_id: Any, code: int, message: str, status: int = 200) -> Reply:
    """A JSON-RPC error: in a 200 when a method refused, 400/404 when the transport did."""
    return Reply(status, rpc_error(request_id, code, message))


async def _with_progress(send: Send, forwarder: progress.Forwarder, post: Any, *args: Any) -> None:
    """A POST whose tools/call asked for progress, run with `forwarder` installed. The
    answer is plain JSON when the call ends before any progress arrived; from the first
    notification on it is an SSE stream: the notifications as they come, then the
    response. The call runs to its end even if the client leaves, as any other."""
    answering = asyncio.get_running_loop().create_task(post(*args), context=forwarder.context())
    # If this request ends first (the client left, a write failed), the call goes on alone.
    answering.add_done_callback(lambda task: task.cancelled() or task.exception())
    streaming = False
    while True:
        arrived = asyncio.ensure_future(forwarder.arrived.wait())
        await asyncio.wait({answering, arrived}, return_when=asyncio.FIRST_COMPLETED)
        arrived.cancel()
        notices = forwarder.take()
        if notices and not streaming:
            streaming = True
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        for notice in notices:
            await _event(send, notice)
        if answering.done():
            break
    reply: Reply = answering.result()
    if not streaming:
        await _send(send, reply)
        return
    if reply.body is not None:
        await _event(send, reply.body)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _event(send: Send, message: Any) -> None:
    frame = f"event: message\ndata: {json.dumps(message)}\n\n".encode()
    await send({"type": "http.response.body", "body": frame, "more_body": True})


async def _send(send: Send, reply: Reply) -> None:
    body = b"" if reply.body is None else json.dumps(reply.body).encode()
    headers = [*reply.headers]
    if reply.body is not None:
        headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


endpoint = McpEndpoint()
