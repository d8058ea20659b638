"""Request bodies over TOOLHUB_MAX_REQUEST_BYTES get 413 before they are read, in a real Daphne.

Memory is measured on the server process (VmRSS from /proc): Daphne used to store a whole
body and then queue all of it for the application, so a 200 MB upload grew it by ~200 MB.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.support.server import Server, daphne

pytestmark = [pytest.mark.server, pytest.mark.one_leg]

BIG = 200 * 1024 * 1024
PIECE = b"x" * (256 * 1024)
# Growth allowed while refusing a 200 MB body: noise, not the body.
RSS_BOUND = 30 * 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


def send_body(server: Server, head: bytes, pieces: Iterator[bytes]) -> tuple[bytes, int]:
    """Send a request from one thread while another reads the answer; returns (answer, sent).

    The sender stops as soon as an answer arrives, like a client that reads while it writes.
    """
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    answered = threading.Event()
    sent = 0

    def sender() -> None:
        nonlocal sent
        try:
            sock.sendall(head)
            for piece in pieces:
                if answered.is_set():
                    return
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the server cut the connection after answering

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    answer = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
            answered.set()
    except OSError:
        pass
    finally:
        answered.set()
        thread.join(30)
        sock.close()
    return answer, sent


def identity(total: int) -> Iterator[bytes]:
    for _ in range(total // len(PIECE)):
        yield PIECE


def chunked(total: int) -> Iterator[bytes]:
    frame = f"{len(PIECE):x}\r\n".encode() + PIECE + b"\r\n"
    for _ in range(total // len(PIECE)):
        yield frame
    yield b"0\r\n\r\n"


def post_head(content_type: str = "application/json", **headers: str) -> bytes:
    lines = [
        "POST /api/v1/invocations/ HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {content_type}",
        *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_and_body(answer: bytes) -> tuple[int, dict[str, str]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def warm_up(server: Server) -> int:
    """One refused request of each kind first, so imports and buffers are not counted."""
    send_body(server, post_head(Content_Length=str(2 * 1024 * 1024)), identity(2 * 1024 * 1024))
    send_body(server, post_head(Transfer_Encoding="chunked"), chunked(2 * 1024 * 1024))
    time.sleep(0.5)
    return rss(server.pid)


def test_it_refuses_a_large_declared_body_with_413_without_growing(server):
    before = warm_up(server)
    answer, sent = send_body(server, post_head(Content_Length=str(BIG)), identity(BIG))
    status, body = status_and_body(answer)
    assert status == 413
    assert str(settings.TOOLHUB_MAX_REQUEST_BYTES) in body["detail"]
    assert sent < BIG  # answered before the body was sent
    assert rss(server.pid) - before < RSS_BOUND


def test_it_refuses_a_large_chunked_body_with_413_without_growing(server):
    before = warm_up(server)
    answer, _ = send_body(server, post_head(Transfer_Encoding="chunked"), chunked(BIG))
    status, body = status_and_body(answer)
    assert status == 413
    assert "too large" in body["detail"]
    assert rss(server.pid) - before < RSS_BOUND


def test_it_sends_no_100_continue_for_a_body_it_will_refuse(server):
    answer, _ = send_body(
        server, post_head(Content_Length=str(BIG), Expect="100-continue"), iter(())
    )
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_it_still_serves_a_body_under_the_limit_chunked_or_not(server):
    body = json.dumps({"toolId": "core__get_current_time", "pad": "y" * 500_000}).encode()
    for head, pieces in [
        (post_head(Content_Length=str(len(body)), Connection="close"), iter([body])),
        (
            post_head(Transfer_Encoding="chunked", Connection="close"),
            iter([f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"]),
        ),
    ]:
        answer, _ = send_body(server, head, pieces)
        assert answer.split()[1] == b"401"  # reached the API, which wants a key


def test_a_form_body_reaches_django_as_it_was_sent(server):
    """Twisted parses a POST's form body for `args`, which Daphne never reads. A multipart
    body it could not parse got Twisted's own bare 400 and a cut connection instead of
    toolhub's answer; an urlencoded or multipart one was parsed on the event loop."""
    broken = b"--x\r\nnot a part at all"
    form = b"toolId=core__get_current_time&pad=" + b"y" * 1000
    for content_type, body in [
        ("multipart/form-data", broken),  # no boundary: Twisted gave up on it
        ("application/x-www-form-urlencoded", form),
    ]:
        head = post_head(content_type, Content_Length=str(len(body)), Connection="close")
        answer, _ = send_body(server, head, iter([body]))
        status, detail = status_and_body(answer)
        assert status == 401, answer  # reached the API, which wants a key
        assert "credentials" in detail["detail"].lower()


@pytest.mark.parametrize(("verbosity", "written"), [(0, ""), (1, ""), (2, "a line\n")])
def test_twisteds_access_line_is_made_only_where_its_log_goes_somewhere(verbosity, written):
    """Below verbosity 2 Daphne sends Twisted's log nowhere and writes its own access log."""
    from toolhub.server.daphne_limits import LimitedHTTPFactory

    factory = LimitedHTTPFactory(SimpleNamespace(verbosity=verbosity))
    factory._logFile = StringIO()
    factory._logFormatter = lambda when, request: "a line"
    factory.log(object())
    assert factory._logFile.getvalue() == written


# ---------------------------------------------------------------- the ASGI middleware alone
# For any other ASGI server (and as a second line behind Daphne): the same refusal, with
# nothing of the body handed to Django.


async def call_asgi(headers: list[tuple[bytes, bytes]], pieces: list[bytes]) -> list[dict]:
    from toolhub.server.asgi_handler import get_asgi_application
    from toolhub.server.limits import BodyLimitMiddleware

    app = BodyLimitMiddleware(get_asgi_application(), limit=4096)
    incoming = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    read = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        read += 1
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/api/v1/invocations/", "raw_path": b"",
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    sent.append({"read": read})
    return sent


async def test_the_middleware_refuses_a_declared_length_without_reading_any_body():
    sent = await call_asgi([(b"content-length", b"5000")], [b"x" * 5000])
    assert sent[0]["status"] == 413
    assert sent[-1] == {"read": 0}


@pytest.mark.django_db
async def test_the_middleware_refuses_a_streamed_body_once_past_the_limit():
    sent = await call_asgi([], [b"x" * 3000] * 10)
    assert [m.get("status") for m in sent if m.get("type") == "http.response.start"] == [413]
    assert sent[-1]["read"] <= 3  # stopped reading after the limit
