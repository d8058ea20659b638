"""Helpers shared by the connection tests: connections, grants, results, a local HTTP server."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from guardian.shortcuts import assign_perm

from apps.connections.models import Connection, Grant
from apps.tenants.models import Tenant
from apps.tenants.principals import agents_group

HTTP = "core__http_request"


def make_connection(
    tenant: Tenant,
    name: str = "service",
    kind: str = "bearer",
    hosts: tuple[str, ...] = ("api.example.com",),
    private: bool = False,
    **secret: str,
) -> Connection:
    connection = Connection(
        tenant=tenant,
        name=name,
        kind=kind,
        allowed_hosts=list(hosts),
        allow_private_network=private,
    )
    connection.set_secret(**(secret or {"token": f"token-of-{name}"}))
    connection.full_clean()
    connection.save()
    return connection


def grant(connection: Connection, principal: str = "agent:test", **fields: Any) -> Grant:
    return Grant.objects.create(
        tenant=connection.tenant, connection=connection, principal=principal, **fields
    )


def permit_use(connection: Connection) -> None:
    """`use_connection` on this connection for every agent of its tenant."""
    assign_perm("connections.use_connection", agents_group(connection.tenant), connection)


def usable(connection: Connection, principal: str = "agent:test", **fields: Any) -> Connection:
    """Granted to `principal`, and usable by the tenant's agents."""
    grant(connection, principal, **fields)
    permit_use(connection)
    return connection


# ---------------------------------------------------------------- a real HTTP server


# Answers that stop short of a whole HTTP response (the server closes after them).
BROKEN = {
    "/short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10,
    "/chunked-cut": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    "/not-http": b"hello, this is not HTTP\r\n\r\n",
}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: int = 0  # the client's port: which TCP connection the request came on


class _Handler(BaseHTTPRequestHandler):
    server: LocalServer

    def setup(self) -> None:
        super().setup()
        if self.server.keep_alive:
            self.protocol_version = "HTTP/1.1"  # HTTP/1.0 (the default) closes every time

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.seen.append(
            Seen(self.command, self.path, headers, body, self.client_address[1])
        )
        if self.server.on_request is not None:  # e.g. an edit made while the tool waits
            self.server.on_request()
        parts = urlsplit(self.path)
        if parts.path == "/hangup":  # a keep-alive answer, then the server closes anyway
            self._json({"bye": True})
            self.close_connection = True
            return
        if parts.path == "/stall":  # 10 of 100 bytes, then silence past the client's timeout
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            time.sleep(1.5)
            self.close_connection = True
            return
        if parts.path in BROKEN:  # raw bytes that are not a whole response, then a close
            self.wfile.write(BROKEN[parts.path])
            self.wfile.flush()
            self.close_connection = True
            return
        if parts.path == "/big":  # size=N bytes of body, more than a result keeps
            (size,) = parse_qs(parts.query)["size"]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", size)
            self.end_headers()
            self.wfile.write(b"x" * int(size))
            return
        if parts.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts.path == "/redirect":
            (target,) = parse_qs(parts.query)["to"]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts.path == "/echo":  # the request's headers, as an echoing target answers
            self._json({"headers": dict(self.headers.items())})
            return
        if parts.path == "/echo/base64":
            dump = json.dumps(dict(self.headers.items())).encode()
            self._json({"encoded": base64.b64encode(dump).decode()})
            return
        if parts.path == "/echo/padded":  # pad=N characters, then the Authorization header
            (pad,) = parse_qs(parts.query)["pad"]
            payload = ("x" * int(pad) + (self.headers.get("Authorization") or "")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if parts.path == "/reflect":  # a redirect that quotes the credential: to=...{credential}
            credential = (self.headers.get("Authorization") or "").split(" ")[-1]
            (target,) = parse_qs(parts.query)["to"]
            self.send_response(302)
            self.send_header("Location", target.replace("{credential}", quote(credential)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts.path.startswith("/ok"):
            payload = json.dumps({"hello": "world", "path": parts.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _json(self, data: Any) -> None:
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output (and the log capture) clean


class LocalServer(ThreadingHTTPServer):
    """HTTP/1.0 by default (a connection per request); `keep_alive` answers HTTP/1.1 and
    keeps connections open, `tls` serves HTTPS with that context."""

    daemon_threads = True

    def __init__(self, keep_alive: bool = False, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[Seen] = []
        self.on_request: Callable[[], None] | None = None
        self.keep_alive = keep_alive
        self.tls = tls
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    @property
    def base(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"


@contextmanager
def local_server(
    keep_alive: bool = False, tls: ssl.SSLContext | None = None
) -> Iterator[LocalServer]:
    server = LocalServer(keep_alive, tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
