"""The bench's load (bench/calls.py `concurrent`): one thread, keep-alive connections on one
selector. Against a real local HTTP/1.1 server: every answer is read whole, whether its
length is given or it comes in chunks; a connection the server closes is opened again;
an error answer stops the bench with what the server said."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from bench.calls import Target, concurrent, parse_response, request_bytes
from bench.fanout import BenchError


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, str, Any]]] = []
    answered = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append((self.command, self.path, self.headers["Authorization"], body))
        self.answer()

    def do_GET(self) -> None:
        Handler.seen.append((self.command, self.path, self.headers["Authorization"], None))
        self.answer()

    def answer(self) -> None:
        Handler.answered += 1
        if self.path == "/refused":
            payload = b'{"ok":false,"error":{"code":"policy_denied"}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        elif self.path == "/missing":
            self.send_error(404)
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"ok":', b"true}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            # Every third answer closes its connection, as a server may at any time.
            closing = self.path == "/closing" and Handler.answered % 3 == 0
            payload = b'{"ok":true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            if closing:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    Handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_each_client_repeats_its_request_and_every_answer_is_counted(port: int) -> None:
    target = Target("POST", "/call", {"toolId": "core__get_current_time"})
    row = concurrent(port, "key-1", target, clients=4, seconds=0.3)
    assert row["requests"] == len(Handler.seen) > 4
    assert row["requests_per_process"] == [row["requests"]]
    expected = ("POST", "/call", "Bearer key-1", {"toolId": "core__get_current_time"})
    assert all(seen == expected for seen in Handler.seen)
    assert 0 < row["p50_ms"] <= row["p99_ms"]


def test_clients_are_spread_over_the_ports_in_turn(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        other = server.server_address[1]
        row = concurrent([port, other], "", Target("GET", "/healthz"), clients=4, seconds=0.3)
    finally:
        server.shutdown()
        server.server_close()
    assert len(row["requests_per_process"]) == 2
    assert min(row["requests_per_process"]) > 0
    assert sum(row["requests_per_process"]) == row["requests"] == len(Handler.seen)
    assert {auth for _, _, auth, _ in Handler.seen} == {None}  # no key, no header


def test_chunked_answers_are_read_whole(port: int) -> None:
    row = concurrent(port, "k", Target("GET", "/chunked"), clients=2, seconds=0.2)
    assert row["requests"] == len(Handler.seen) > 2


def test_a_connection_the_server_closes_is_opened_again(port: int) -> None:
    row = concurrent(port, "k", Target("GET", "/closing"), clients=3, seconds=0.3)
    assert row["requests"] == len(Handler.seen) > 6


@pytest.mark.parametrize(("path", "said"), [("/refused", '"ok":false'), ("/missing", "-> 404")])
def test_an_error_answer_stops_the_bench_with_what_the_server_said(
    port: int, path: str, said: str
) -> None:
    with pytest.raises(BenchError, match=said):
        concurrent(port, "k", Target("GET", path), clients=2, seconds=5)


def test_a_server_that_closes_every_connection_fails_the_bench() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def close_every_connection() -> None:
        while True:
            try:
                accepted, _ = listener.accept()
            except OSError:
                return
            accepted.close()

    threading.Thread(target=close_every_connection, daemon=True).start()
    try:
        with pytest.raises(BenchError, match="connection closed"):
            concurrent(port, "k", Target("GET", "/"), clients=1, seconds=5)
    finally:
        listener.close()


def test_the_request_is_encoded_once_as_http_1_1() -> None:
    raw = request_bytes(8000, "secret", Target("POST", "/api/v1/invocations/", {"a": 1}))
    head, body = raw.split(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"POST /api/v1/invocations/ HTTP/1.1",
        b"Host: 127.0.0.1:8000",
        b"Authorization: Bearer secret",
        b"Content-Type: application/json",
        b"Content-Length: 8",
    ]
    assert body == b'{"a": 1}'


@pytest.mark.parametrize(
    ("buffer", "parsed"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Len", None),  # headers not in yet
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", None),  # body not in yet
        (
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nokHTTP/1.1",
            (201, b"ok", b"HTTP/1.1", False),
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            (200, b"", b"", True),
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", None),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            (200, b"abcde", b"", False),
        ),
    ],
)
def test_an_answer_is_parsed_only_once_it_is_whole(
    buffer: bytes, parsed: tuple[int, bytes, bytes, bool] | None
) -> None:
    assert parse_response(buffer) == parsed


def test_an_answer_without_a_length_is_an_error() -> None:
    with pytest.raises(BenchError, match="neither Content-Length nor chunks"):
        parse_response(b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\nbody")
