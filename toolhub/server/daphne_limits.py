"""Daphne's HTTP request with the body limit enforced as bytes arrive (see
toolhub/server/limits.py).

Twisted calls `gotLength` when the headers end and `handleContentChunk` for each piece of
body; Daphne's `WebRequest` only starts the application once the whole body is in. Refusing
here is the only point at which an oversized body is never stored.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor

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
