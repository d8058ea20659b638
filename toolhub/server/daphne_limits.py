"""Daphne's HTTP request with the body limit enforced as bytes arrive (see
toolhub/server/limits.py), and health probes answered without an application.

Twisted calls `gotLength` when the headers end and `handleContentChunk` for each piece of
body; Daphne's `WebRequest` only starts the application once the whole body is in. Refusing
here is the only point at which an oversized body is never stored.

`/healthz` and a `/readyz` whose checks are fresh are answered in `process`, when the
request is whole, from toolhub/ops/health.py's `answer_at_once`: Daphne would otherwise
start an application task for it, which runs on a later turn of the event loop, and its
answer is written on another; under load each turn waits behind everything else the
process does (issue 47).
"""

from __future__ import annotations

import time
from io import BytesIO
from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor

from toolhub.ops import health
from toolhub.server.limits import LINGER_SECONDS, max_request_bytes, refusal_body


class LimitedRequest(WebRequest):
    _refused = False
    _received = 0
    _linger: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Twisted parses a POST's form body into `args`, which Daphne never reads (the
        # application gets the body as it came, and Django parses it). For every POST that
        # meant parsing its Content-Type with the email package on the event loop, 9 % of
        # the loop's time per JSON call (issue 13), and a multipart body of up to
        # TOOLHUB_MAX_REQUEST_BYTES parsed there in full, holding up every other request.
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: int | None) -> None:
        self._limit = max_request_bytes()
        if length is not None and length > self._limit:
            # No `100 Continue` for a body that will be refused (Twisted sends it next).
            self.requestHeaders.removeHeader(b"Expect")
            self.content = BytesIO()
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self._limit:
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self._refused:
            super().requestReceived(command, path, version)

    def process(self) -> Any:
        answer = None
        if not self.requestHeaders.hasHeader(b"upgrade"):
            host = self.getHeader(b"host") or self.getHost().host
            answer = health.answer_at_once(
                self.method.decode("latin-1"),
                self.path.decode("latin-1"),
                host.decode("latin-1") if isinstance(host, bytes) else host,
            )
        if answer is None:
            return super().process()
        self._answer_probe(*answer)
        return None

    def _answer_probe(self, status: int, body: bytes) -> None:
        """A whole JSON answer, written now; the connection stays open for the next probe.
        Daphne's access line as for any request."""
        self.request_start = time.time()
        peer = self.client
        client = f"{peer.host}:{peer.port}" if hasattr(peer, "host") else None
        self.setResponseCode(status)
        self.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
        self.responseHeaders.setRawHeaders(b"content-length", [b"%d" % len(body)])
        if self.server.server_name:
            self.setHeader(b"server", self.server.server_name.encode())
        self.write(body)
        self.finish()
        self.server.log_action(
            "http",
            "complete",
            {
                "path": self.uri.decode("latin-1"),
                "status": status,
                "method": self.method.decode("latin-1"),
                "client": client,
                "time_taken": self.duration(),
                "size": self.sentLength,
            },
        )

    def connectionLost(self, reason: Any) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)

    def _refuse(self) -> None:
        """Answer 413, stop writing, drop what still comes, and cut the connection later.

        Closing at once would make the kernel reset a connection with unread data, and a
        client still sending would see the reset instead of the answer.
        """
        self._refused = True
        self.content.close()
        transport = self.channel.transport
        body = refusal_body(self._limit)
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n"
            b"Connection: close\r\n\r\n" + body
        )
        try:
            transport.loseWriteConnection()
        except AttributeError:  # a transport without half-close (e.g. some TLS wrappers)
            transport.loseConnection()
        clock: Any = reactor  # the installed reactor; its interface methods confuse mypy
        self._linger = clock.callLater(LINGER_SECONDS, transport.abortConnection)


class LimitedHTTPFactory(HTTPFactory):
    def log(self, request: Any) -> None:
        """Twisted's access line for `request`, only where someone reads it. Daphne writes
        its own (`Server.log_action`) and, below verbosity 2, sends Twisted's log nowhere:
        formatting the line anyway was 3 % of the event loop's time per request (issue 13)."""
        if self.server.verbosity > 1:
            super().log(request)

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LimitedRequest
        return protocol
