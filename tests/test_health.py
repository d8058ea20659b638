"""Liveness and readiness probes (toolhub/ops/health.py): answered without credentials,
in front of Django, and while the server drains; the close codes Daphne can send."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tests.support.server import free_port
from toolhub.ops import health
from toolhub.ops.health import GRACE_S, Check, HealthProbes, Readiness
from toolhub.server import draining
from toolhub.server.daphne_frames import daphne_close_code


@pytest.fixture
def fresh_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Readiness]:
    """The process's checks, started afresh for the test's settings, stopped after."""
    readiness = Readiness()
    monkeypatch.setattr(health, "readiness", readiness)
    yield readiness
    readiness.stop()


def test_healthz_answers_ok_without_authentication():
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"status": "ok"}


def test_healthz_does_not_touch_the_database():
    """No django_db mark: any query here would fail the test."""
    assert Client().get("/healthz").status_code == 200


@pytest.mark.django_db
def test_readyz_reports_the_database_and_channel_layer_reachable(fresh_checks):
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ok",
        "checks": {"database": True, "channelLayer": True},
    }


@pytest.mark.django_db
def test_readyz_is_503_when_the_channel_layers_redis_is_not_there(settings, fresh_checks):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "toolhub.layers.redis_layer.RedisLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{free_port()}/0"}]},
        }
    }
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "checks": {"database": True, "channelLayer": False},
    }


# ------------------------------------------------------------ in front of Django


async def asgi_get(path: str, host: bytes = b"testserver") -> tuple[int, Any]:
    passed: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"host", host)]}
    await HealthProbes(app)(scope, receive, send)
    assert passed == ([] if path in HealthProbes.PATHS else [path])
    return sent[0]["status"], json.loads(sent[1]["body"])


@pytest.mark.django_db(transaction=True)
async def test_the_probes_are_answered_before_django_and_other_paths_pass(fresh_checks):
    assert await asgi_get("/healthz") == (200, {"status": "ok"})
    ready = {"status": "ok", "checks": {"database": True, "channelLayer": True}}
    assert await asgi_get("/readyz") == (200, ready)
    assert await asgi_get("/api/v1/tools/") == (299, {})


async def test_a_probe_with_a_host_not_allowed_is_refused_as_django_would():
    assert await asgi_get("/healthz", host=b"evil.example") == (
        400,
        {"detail": "Invalid Host header."},
    )


async def test_while_draining_healthz_is_200_and_readyz_503(monkeypatch, fresh_checks):
    monkeypatch.setattr(draining, "_stopping", True)
    assert await asgi_get("/healthz") == (200, {"status": "ok"})
    assert await asgi_get("/readyz") == (503, {"status": "draining", "checks": {}})


# ------------------------------------------------------------ answered by Daphne's protocol


class Served:
    """One request through Daphne's HTTP protocol (toolhub's LimitedHTTPFactory) on an
    in-memory transport: what was written back synchronously, inside `dataReceived`
    (before any turn of the event loop), and which paths reached the application."""

    def __init__(self, raw: bytes) -> None:
        from daphne.server import Server
        from twisted.internet.testing import StringTransport

        from toolhub.server.daphne_limits import LimitedHTTPFactory

        self.passed: list[str] = []

        def application(scope: Any, receive: Any, send: Any) -> Any:
            self.passed.append(scope["path"])
            return receive()  # the application's coroutine (never answers)

        server = Server(application, endpoints=["tcp:port=0"], signal_handlers=False)
        server.connections = {}  # what Server.run() sets up
        protocol = LimitedHTTPFactory(server).buildProtocol(None)
        self.transport = StringTransport()
        protocol.makeConnection(self.transport)
        protocol.dataReceived(raw)
        self.written = self.transport.value()

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = self.written.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines)
        return int(status_line.split()[1]), headers, body


def request(path: str, method: str = "GET", host: str = "testserver") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


READY = {"status": "ok", "checks": {"database": True, "channelLayer": True}}


@pytest.mark.django_db(transaction=True)
async def test_daphne_answers_readyz_itself_once_its_checks_are_fresh(fresh_checks):
    """The first probe (checks never run) goes to the application, which waits for fresh
    checks (HealthProbes); once they are fresh, the protocol answers in dataReceived."""
    first = Served(request("/readyz"))
    assert first.written == b""
    assert first.passed == ["/readyz"]
    assert await fresh_checks.results() == READY["checks"]
    served = Served(request("/readyz"))
    assert served.passed == []
    status, headers, body = served.answer()
    assert (status, json.loads(body)) == (200, READY)
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(body))


@pytest.mark.django_db(transaction=True)
async def test_daphne_answers_readyz_503_itself_when_a_fresh_check_failed(settings, fresh_checks):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "toolhub.layers.redis_layer.RedisLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{free_port()}/0"}]},
        }
    }
    await fresh_checks.results()
    served = Served(request("/readyz"))
    assert served.passed == []
    status, _, body = served.answer()
    assert (status, json.loads(body)) == (
        503,
        {"status": "unavailable", "checks": {"database": True, "channelLayer": False}},
    )


def test_daphne_answers_healthz_and_a_bad_host_itself_and_passes_other_requests():
    status, _, body = Served(request("/healthz")).answer()
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    head = Served(request("/healthz", method="HEAD"))
    assert head.passed == [] and head.answer()[:2][0] == 200
    assert head.answer()[2] == b""  # HEAD: no body
    status, _, body = Served(request("/readyz", host="evil.example")).answer()
    assert (status, json.loads(body)) == (400, {"detail": "Invalid Host header."})


async def test_daphne_passes_other_paths_and_methods_to_the_application():
    for raw in (request("/api/v1/tools/"), request("/readyz", method="POST")):
        served = Served(raw)
        assert served.written == b""
        assert len(served.passed) == 1


def test_while_draining_daphne_answers_readyz_503_itself(monkeypatch):
    monkeypatch.setattr(draining, "_stopping", True)
    status, _, body = Served(request("/readyz")).answer()
    assert (status, json.loads(body)) == (503, {"status": "draining", "checks": {}})


# ------------------------------------------------------------ the checks' rules


def ran(check: Check) -> None:
    done = threading.Event()
    check.wanted(done.set)
    assert done.wait(5)


def test_a_check_that_fails_is_down_at_once_and_a_timeout_only_after_the_grace():
    outcome: dict[str, BaseException | None] = {"raise": None}

    def probe() -> None:
        if outcome["raise"] is not None:
            raise outcome["raise"]

    check = Check("dep", probe)
    ran(check)
    assert check.up(time.monotonic())
    outcome["raise"] = TimeoutError("slow")
    ran(check)
    now = time.monotonic()
    assert check.up(now), "a timeout within the grace keeps the last success"
    assert not check.up(now + GRACE_S)
    outcome["raise"] = ConnectionRefusedError("refused")
    ran(check)
    assert not check.up(time.monotonic())
    outcome["raise"] = None
    ran(check)
    assert check.up(time.monotonic())


def test_a_check_that_hangs_past_its_timeout_counts_as_timed_out():
    release = threading.Event()
    calls = []

    def probe() -> None:
        calls.append(1)
        if len(calls) > 1:
            release.wait(10)

    check = Check("dep", probe)
    ran(check)
    check.wanted()
    while check.running_since is None:
        time.sleep(0.005)
    later = check.running_since + health.CHECK_TIMEOUT_S + 0.01
    assert check.up(later)  # within the grace of the last success
    assert not check.up(later + GRACE_S)
    release.set()


def test_a_check_that_never_ran_is_down():
    assert not Check("dep", lambda: None).up(time.monotonic())


# ------------------------------------------------------------ close codes Daphne sends


def test_every_close_code_is_mapped_into_what_daphne_sends():
    for code in range(6000):
        mapped = daphne_close_code(code)
        assert mapped == 1000 or 3000 <= mapped <= 4999, (code, mapped)
    assert [daphne_close_code(c) for c in (None, 1000, 1008, 1011, 1012, 4403)] == [
        None,
        1000,
        4008,
        4011,
        4012,
        4403,
    ]
