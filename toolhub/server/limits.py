"""The request body limit: a body over TOOLHUB_MAX_REQUEST_BYTES gets 413 before it is read.

Daphne (through Twisted's `http.Request`) reads a whole request body into a file before
the application sees any of it, then puts all of it on the application's queue at once.
An unauthenticated 300 MB POST therefore cost 300 MB of memory whatever the view did, and
the allocator did not give it back. So the limit is enforced where the bytes arrive:

- `LimitedRequest` is Daphne's request with a byte count. A declared `Content-Length`
  over the limit is refused when the headers end, before any body byte is stored (and
  without `100 Continue`); a chunked body is counted as it streams and refused once past
  the limit. The refused bytes are dropped as they come, so memory stays flat.
- `BodyLimitMiddleware` does the same at the ASGI level, for any other ASGI server and as
  a second line: Django's handler would otherwise spool the whole body.

Daphne has no setting for its request class, so `install_daphne_body_limit()` (called by
`toolhub.asgi`, which Daphne imports before it starts listening) replaces the HTTP factory
Daphne's server builds. That keeps the documented `daphne ... toolhub.asgi:application`
command protected as it is.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

# After refusing, keep reading (and dropping) for this long so that a client still sending
# sees the 413 instead of a connection reset; then the connection is cut.
LINGER_SECONDS = 5.0


def max_request_bytes() -> int:
    return int(settings.TOOLHUB_MAX_REQUEST_BYTES)


def refusal_body(limit: int) -> bytes:
    return json.dumps(
        {"detail": f"The request body is too large; the limit is {limit} bytes."}
    ).encode()


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length header's value; None when absent or unreadable (Daphne refuses those)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


class BodyLimitMiddleware:
    """ASGI: answer 413 for a declared or streamed body over the limit, keeping none of it."""

    def __init__(self, app: ASGIApp, limit: int | None = None) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit if self.limit is not None else max_request_bytes()
        length = declared_length(scope.get("headers", []))
        if length is not None and length > limit:
            await send_refusal(send, limit)
            return

        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # The application sees a client that went away (Django drops what it
                    # spooled); this middleware answers instead.
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counting_receive, tracking_send)
        if exceeded and not started:
            await send_refusal(send, limit)


async def send_refusal(send: Send, limit: int) -> None:
    await send_json(send, 413, refusal_body(limit))


async def send_json(
    send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """A whole JSON answer sent by an ASGI layer in front of Django, closing the connection."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_daphne_body_limit() -> None:
    """Make Daphne's server build `LimitedRequest`s (idempotent; a no-op without Daphne)."""
    try:
        from daphne import server
    except ImportError:  # pragma: no cover - Daphne is a dependency
        return
    from toolhub.server.daphne_limits import LimitedHTTPFactory

    server.HTTPFactory = LimitedHTTPFactory
