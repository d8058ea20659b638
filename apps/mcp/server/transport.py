"""`/mcp/`: the streamable HTTP transport, as a plain ASGI app inside toolhub's router.

POST carries one JSON-RPC message and gets `application/json` back (a response, or
202 for a notification). GET opens a server-to-client event stream that carries
`notifications/tools/list_changed`. DELETE is 405 (see sessions.py). Every request
presents the API key (`Authorization: Bearer`, else 401) and, after `initialize`,
the `Mcp-Session-Id` it was given. The body limit of toolhub.limits applies as for
every HTTP request: the router sits inside `BodyLimitMiddleware`, and Daphne's
request class refuses oversized bodies before this app is called.

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
from apps.mcp.server import methods
from apps.mcp.server.methods import RpcError
from apps.mcp.server.notifications import groups_for
from apps.mcp.server.sessions import Session
from apps.tenants.callers import Caller
from apps.tenants.models import ApiKey
from toolhub import draining, json_input
from toolhub.limits import Receive, Scope, Send
from toolhub.ws_auth import allowed_host, allowed_origin

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
        key = await _authenticate(_header(scope, b"authorization"))
        if key is None:
            await _send(send, _unauthorized())
            return
        version = _header(scope, VERSION_HEADER)
        if version is not None and version not in methods.PROTOCOL_VERSIONS:
            detail = f"Unsupported MCP-Protocol-Version; use one of {methods.PROTOCOL_VERSIONS}."
            await _send(send, Reply(400, rpc_error(None, methods.INVALID_REQUEST, detail)))
            return
        if method == "POST":
            body = await _read_body(receive)
            if body is None:
                return  # the client went away (or the body limit cut it off)
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
                result, started = methods.initialize(key.pk, params)
            except RpcError as exc:
                return _error(request_id, exc.code, exc.message)
            reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
            return Reply(200, reply, ((SESSION_HEADER, started.id.encode()),))
        session_id = _header(scope, SESSION_HEADER)
        if session_id is None:
            return _error(
                request_id, methods.INVALID_REQUEST, "Missing Mcp-Session-Id header.", status=400
            )
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
                result = await _answer(key, session, method, params)
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
        # One budget of open streams per principal, WebSockets and MCP streams alike.
        slot = await connection_slots.acquire(f"{key.tenant_id}:{key.principal}")
        if slot is None:
            detail = "Too many open streams for this principal; close one first."
            await _send(send, _refusal(429, detail, ((b"retry-after", b"5"),)))
            return
        try:
            await EventStream(key, send).run(receive)
        finally:
            await slot.release()


class EventStream:
    """One GET stream: list_changed notifications until the client leaves or the key is revoked."""

    def __init__(self, key: ApiKey, send: Send) -> None:
        self.key, self.send = key, send
        # Only "list again" travels here: one pending notice says all a full queue would.
        self.pending: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self.ended = asyncio.Event()

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
        # reconnects to another process (toolhub/draining.py).
        forget = draining.on_stop(self.ended.set)
        subscribed: list[str] = []
        try:
            for group in groups:
                await feeds_for(layer).subscribe(layer, group, self)
                subscribed.append(group)
            await self._pump(receive)
        finally:
            for group in subscribed:
                await feeds_for(layer).unsubscribe(group, self)
            await watch.unwatch(self.key.pk, self)
            forget()
            with contextlib.suppress(Exception):  # the client may be gone already
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})

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


NOTICE = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
RESTARTING = "The server is restarting: ask for this task's result again."


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _await_task(key: ApiKey, params: dict[str, Any], receive: Receive) -> Any:
    """`tasks/result` blocks until the call ends (e.g. a held call is decided).

    It waits here, on the event loop, re-reading the record every poll interval, so a
    wait of minutes holds no thread; it stops when the client goes away, and when the
    server stops (the client asks again, of another process: toolhub/draining.py).
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


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _key_for(authorization: str | None) -> ApiKey | None:
    if authorization is None:
        return None
    scheme, _, raw = authorization.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return None
    key = ApiKey.objects.for_raw_key(raw.strip())
    if key is not None:
        key.touch()
    return key


def _run(key: ApiKey, session: Session, method: str, params: dict[str, Any]) -> Any:
    return methods.answer(Caller.for_api_key(key), session, method, params)


# Worker threads (not the one thread "thread-sensitive" code shares), with the database
# connection handling of channels.db, so a slow tool never holds up another request.
_authenticate = database_sync_to_async(_key_for, thread_sensitive=False)
_answer = database_sync_to_async(_run, thread_sensitive=False)


def _finished_task(key: ApiKey, params: dict[str, Any]) -> Any:
    return methods.task_result(Caller.for_api_key(key), params)


_task_result = database_sync_to_async(_finished_task, thread_sensitive=False)


def _unauthorized() -> Reply:
    return _refusal(
        401,
        "Authentication required: Authorization: Bearer <API key>.",
        ((b"www-authenticate", b'Bearer realm="toolhub"'),),
    )


def _refusal(status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    """A refusal by the transport, its body a JSON-RPC error so MCP clients show the message."""
    return Reply(status, rpc_error(None, methods.INVALID_REQUEST, message), headers)


def _error(request_id: Any, code: int, message: str, status: int = 200) -> Reply:
    """A JSON-RPC error: in a 200 when a method refused, 400/404 when the transport did."""
    return Reply(status, rpc_error(request_id, code, message))


async def _send(send: Send, reply: Reply) -> None:
    body = b"" if reply.body is None else json.dumps(reply.body).encode()
    headers = [*reply.headers]
    if reply.body is not None:
        headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


endpoint = McpEndpoint()
