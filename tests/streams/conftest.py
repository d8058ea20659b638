"""Helpers for the stream tests: a real Daphne, HTTP calls through it, WebSocket clients.

Events are produced through Daphne's HTTP API, never in the test process: an event
emitted here would go to this process's in-memory channel layer, not to Daphne's.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from guardian.shortcuts import assign_perm
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.conftest import Agent, allow, make_agent
from tests.support.server import Server, daphne

OPEN_TIMEOUT = 10.0
EVENT_TIMEOUT = 15.0
# How long "nothing arrives" is watched for. Events of one HTTP call are pushed
# before its response returns, so a short wait after the response is enough.
QUIET = 1.0


@pytest.fixture
def acme(test_tools: list[str]) -> Agent:
    """An agent of tenant acme that may call test__echo and test__confirm."""
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo", "test__confirm")
    return agent


@pytest.fixture
def globex(test_tools: list[str]) -> Agent:
    """An agent of another tenant, globex, allowed the same tools."""
    agent = make_agent("globex", "agent:other")
    allow(agent.tenant, "test__echo", "test__confirm")
    return agent


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    """A Daphne per test. One shared by several tests would cache content types whose
    ids change when a transactional test's flush re-creates them, and then deny
    every permission check (serialized_rollback would keep the ids, but leaves the
    tables empty for the transactional tests of other modules that run after)."""
    with daphne() as base:
        yield base


# ---------------------------------------------------------------- HTTP through Daphne


def request(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    opener: urllib.request.OpenerDirector | None = None,
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{base}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=30) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


class KeyClient:
    """An agent calling Daphne with `Authorization: Bearer <key>`."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def invoke(self, tool_id: str, **body: Any) -> dict[str, Any]:
        status, data = request(
            self.base, "POST", "/api/v1/invocations/", {"toolId": tool_id, **body}, self.headers
        )
        assert status in (200, 202), (status, data)
        return data

    def ticket(self, run_id: str) -> tuple[int, Any]:
        return request(
            self.base, "POST", "/api/v1/stream-tickets/", {"runId": run_id}, self.headers
        )


class Browser:
    """A staff member's browser: logs in through the admin form, keeps the cookies."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def login(self, username: str, password: str) -> Browser:
        with self.opener.open(f"{self.base}/admin/login/", timeout=30) as response:
            page = response.read().decode()
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, "no CSRF token on the admin login page"
        form = urllib.parse.urlencode(
            {
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": match.group(1),
                "next": "/admin/",
            }
        ).encode()
        req = urllib.request.Request(
            f"{self.base}/admin/login/?next=/admin/",
            data=form,
            headers={"Origin": self.base, "Referer": f"{self.base}/admin/login/"},
        )
        with self.opener.open(req, timeout=30) as response:
            response.read()
        assert self.cookie("sessionid"), f"{username} could not log in through the admin form"
        return self

    @property
    def ws_headers(self) -> dict[str, str]:
        """What a browser sends on the handshake: its cookies and its page's Origin."""
        cookies = "; ".join(f"{c.name}={c.value}" for c in self.jar)
        return {"Cookie": cookies, "Origin": self.base}

    def post(self, path: str, body: Any, tenant: str | None = None) -> tuple[int, Any]:
        headers = {
            "X-CSRFToken": self.cookie("csrftoken") or "",
            "Origin": self.base,
            "Referer": f"{self.base}/console/",
        }
        if tenant:
            headers["X-Toolhub-Tenant"] = tenant
        return request(self.base, "POST", path, body, headers, self.opener)

    def decide(self, approval_id: str, decision: str = "approve", reason: str = "") -> Any:
        status, data = self.post(
            f"/api/v1/approvals/{approval_id}/decision/", {"decision": decision, "reason": reason}
        )
        assert status == 200, (status, data)
        return data


# ---------------------------------------------------------------- WebSockets


def ws_url(base: str, path: str) -> str:
    return base.replace("http://", "ws://", 1) + path


def open_ws(base: str, path: str, headers: dict[str, str] | None = None) -> ClientConnection:
    """A WebSocket client; use it as a context manager (`with open_ws(...) as ws:`)."""
    return connect(
        ws_url(base, path),
        additional_headers=headers or {},
        open_timeout=OPEN_TIMEOUT,
        close_timeout=2,
        max_size=2**22,
    )


def refusal(
    base: str, path: str, headers: dict[str, str] | None = None, wait: float = 2.0
) -> int | str:
    """How a refused stream ends: its close code, or "HTTP <status>" if the handshake failed.

    Returns "open" when the server neither refuses nor closes (nor sends) for `wait` s.
    """
    try:
        with open_ws(base, path, headers) as ws:
            try:
                while True:
                    ws.recv(timeout=wait)
            except TimeoutError:
                return "open"
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else "closed without a close frame"
    except InvalidStatus as exc:
        return f"HTTP {exc.response.status_code}"


def events(
    ws: ClientConnection, count: int, timeout: float = EVENT_TIMEOUT
) -> list[dict[str, Any]]:
    """The next `count` events; fails with what did arrive if they do not."""
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        remaining = deadline - time.monotonic()
        try:
            received.append(json.loads(ws.recv(timeout=max(remaining, 0.01))))
        except TimeoutError:
            raise AssertionError(
                f"expected {count} events within {timeout} s, got {len(received)}: {received}"
            ) from None
    return received


def nothing_arrives(ws: ClientConnection, seconds: float = QUIET) -> None:
    try:
        message = ws.recv(timeout=seconds)
    except TimeoutError:
        return
    raise AssertionError(f"expected no event, got {message!r}")


# ---------------------------------------------------------------- staff


def operator(
    username: str, tenant: Tenant, *, decide: tuple[str, ...] = (), superuser: bool = False
) -> User:
    """A staff member of `tenant`, with decide_approval on the given tools."""
    user = User.objects.create_user(
        username, password=f"pw-{username}-123", is_staff=True, is_superuser=superuser
    )
    tenant.members.add(user)
    for tool in Tool.objects.filter(pk__in=decide):
        assign_perm("tools.decide_approval", user, tool)
    return user


def logged_in(base: str, user: User) -> Browser:
    return Browser(base).login(user.get_username(), f"pw-{user.get_username()}-123")
