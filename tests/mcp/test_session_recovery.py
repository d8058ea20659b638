"""Servers that restart, end or refuse a session, or start slowly: toolhub recovers by
itself and never sends a request the server may have run a second time.

tests/mcp/servers/counting.py (the official SDK's server) writes down every call it
runs; over HTTP the SDK answers 404 for a session it does not have, as the spec says.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from apps.mcp import sessions
from apps.mcp.models import McpServer
from apps.mcp.sessions import pool
from tests.conftest import Agent, allow, make_agent
from tests.mcp.conftest import SERVERS, add, enable
from tests.support.server import free_port
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]
COUNTING = f"{SERVERS}/counting.py"


class Runs:
    """What counting.py ran, one (tool, tag) per run, whichever of its processes ran it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, tool: str) -> list[str]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [line.split()[1] for line in lines if line.split()[0] == tool]


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    return Runs(tmp_path / "runs.txt")


class HttpServer:
    """counting.py over streamable HTTP, killed and started again on the same port."""

    def __init__(self, runs: Runs, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.argv = [sys.executable, COUNTING, str(runs.path), "--port", str(self.port)]
        self.sessions_file = Path(f"{runs.path}.sessions")
        self.env = {**os.environ, **env}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError("counting.py did not listen")

    def kill(self) -> None:
        """SIGKILL: whatever it was running ends there, and its sessions with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def end_sessions(self) -> None:
        """The server ends every session it opened and stays up (an idle timeout would)."""
        for session_id in self.sessions_file.read_text().split():
            request = urllib.request.Request(
                self.url, method="DELETE", headers={"mcp-session-id": session_id}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 200


@pytest.fixture
def http_server(runs: Runs) -> Iterator[HttpServer]:
    server = HttpServer(runs)
    server.start()
    yield server
    server.kill()


def imported(url: str, *tools: str) -> Agent:
    """counting.py at `url` added as `calc`, synced, `tools` enabled and allowed."""
    call_command("mcp_add", "calc", "--url", url, "--allow-private-network", stdout=io.StringIO())
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    tool_ids = [f"mcp__calc__{tool}" for tool in tools]
    enable(*tool_ids)
    agent = make_agent("acme")
    allow(agent.tenant, *tool_ids)
    return agent


def bump(agent: Agent, tag: str, server: str = "calc") -> Any:
    return agent.invoke(f"mcp__{server}__bump", args={"tag": tag}).json()


@pytest.fixture
def root_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-123456"))
    return client


# -- HTTP: the session is gone, the server says 404 ------------------------------------


def test_a_restarted_http_server_serves_the_next_call_without_restarting_toolhub(http_server, runs):
    agent = imported(http_server.url, "bump")
    assert bump(agent, "before")["ok"] is True
    http_server.restart()  # its sessions are gone: it answers 404 for them
    body = bump(agent, "after")
    assert body["ok"] is True, body
    assert runs("bump") == ["before", "after"]  # each ran once


def test_discover_tools_works_after_the_http_server_restarted(http_server, root_client):
    imported(http_server.url)
    http_server.restart()
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    http_server.restart()
    server = McpServer.objects.get(name="calc")
    page = root_client.post(
        reverse("admin:mcp_mcpserver_changelist"),
        {"action": "sync", "_selected_action": [server.pk]},
        follow=True,
    ).content.decode()
    assert "calc: 0 new, 0 changed, 0 unusable, 0 gone." in page.lower()
    server.refresh_from_db()
    assert server.last_error == ""


def test_a_session_the_server_ended_is_replaced_and_the_refused_call_sent_once_more(
    http_server, runs
):
    agent = imported(http_server.url, "bump")
    assert bump(agent, "first")["ok"] is True
    http_server.end_sessions()  # the server is up, the session is not
    body = bump(agent, "second")
    assert body["ok"] is True, body
    assert runs("bump") == ["first", "second"]


def test_calls_made_together_after_a_restart_each_run_exactly_once(http_server, runs):
    agent = imported(http_server.url, "bump")
    assert bump(agent, "warm")["ok"] is True
    http_server.restart()
    tags = [f"t{n}" for n in range(6)]
    answers: dict[str, Any] = {}
    threads = [
        threading.Thread(target=in_thread(lambda tag=tag: answers.update({tag: bump(agent, tag)})))
        for tag in tags
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(answers[tag]["ok"] for tag in tags), answers
    assert sorted(runs("bump")) == sorted(["warm", *tags])


@pytest.mark.parametrize("interruption", ["restart", "end_sessions"])
def test_a_call_the_server_was_running_when_its_session_ended_is_never_sent_again(
    interruption, http_server, runs
):
    """The server ran it (the line is written first): the call fails as unavailable, and
    neither the server nor a new session ever sees it again, whether the server died with
    it or, still up, ended the session under it. Only a 404 for the session, answered
    before anything runs, is sent a second time."""
    agent = imported(http_server.url, "bump", "bump_slowly")
    answers: list[Any] = []
    slow = threading.Thread(
        target=in_thread(
            lambda: answers.append(
                agent.invoke("mcp__calc__bump_slowly", args={"seconds": 3, "tag": "slow"}).json()
            )
        )
    )
    slow.start()
    deadline = time.monotonic() + 10
    while not runs("bump_slowly") and time.monotonic() < deadline:
        time.sleep(0.05)
    getattr(http_server, interruption)()  # mid-call
    slow.join(20)
    [body] = answers
    assert body["ok"] is False and body["errorCode"] == "unavailable", body
    assert bump(agent, "next")["ok"] is True
    time.sleep(3)  # as long as the slow call would take, had it been sent again
    assert runs("bump_slowly") == ["slow"]
    assert runs("bump") == ["next"]


# -- HTTP: a 400 is not the spec's sign of a lost session ------------------------------


def test_a_400_for_the_session_fails_the_call_unsent_and_the_next_call_starts_a_new_one(runs):
    """servers built on the TypeScript SDK's example answer a session they lost with 400
    "No valid session ID provided". 400 is what the spec has a server answer a request
    *without* a session id: nothing says the request was not run, so it is not sent
    again. The session is not used for another call, though: the next one starts anew."""
    server = HttpServer(runs, MCP_LOST_SESSION_STATUS="400")
    server.start()
    try:
        agent = imported(server.url, "bump")
        assert bump(agent, "before")["ok"] is True
        server.restart()
        refused = bump(agent, "refused")
        assert refused["ok"] is False and refused["errorCode"] == "execution", refused
        assert refused["safeMessage"] == "calc/bump: Bad Request: No valid session ID provided"
        after = bump(agent, "after")
        assert after["ok"] is True, after
        assert runs("bump") == ["before", "after"]
    finally:
        server.kill()


# -- stdio: a process that exited is started again by the next call ---------------------


def children(named: str) -> list[int]:
    """This process's child processes whose command line mentions `named`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and named in cmdline and " Z " not in stat:
            found.append(int(entry.name))
    return found


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if " Z " in Path(f"/proc/{pid}/stat").read_text(errors="replace"):
                break  # exited; its parent has not reaped it yet
        except (FileNotFoundError, ProcessLookupError):
            break  # reaped (between a check and the read, too)
        time.sleep(0.02)
    time.sleep(0.2)  # "between calls": not in the same instant as the next one


def test_a_killed_stdio_server_is_restarted_by_the_next_call():
    add("time", "mcp-server-time", timeout_ms=10000)
    time_tool = "mcp__time__get_current_time"
    enable(time_tool)
    agent = make_agent("acme")
    allow(agent.tenant, time_tool)
    assert agent.invoke(time_tool, args={"timezone": "UTC"}).json()["ok"] is True
    [first] = children("mcp-server-time")
    os.kill(first, signal.SIGKILL)
    wait_gone(first)
    body = agent.invoke(time_tool, args={"timezone": "UTC"}).json()
    assert body["ok"] is True, body
    assert children("mcp-server-time") not in ([], [first])


def test_a_stdio_call_the_server_was_running_when_killed_is_not_sent_again(runs):
    add("count", f"python {COUNTING} {runs.path}", timeout_ms=10000)
    enable("mcp__count__bump", "mcp__count__bump_slowly", "mcp__count__pid")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__count__bump", "mcp__count__bump_slowly", "mcp__count__pid")
    pid = int(agent.invoke("mcp__count__pid").json()["result"]["content"][0]["text"])
    threading.Timer(1.5, os.kill, (pid, signal.SIGKILL)).start()
    body = agent.invoke("mcp__count__bump_slowly", args={"seconds": 5, "tag": "slow"}).json()
    assert body["ok"] is False and body["errorCode"] == "unavailable", body
    assert bump(agent, "next", server="count")["ok"] is True
    assert runs("bump_slowly") == ["slow"]


# -- start-up: its own bound ------------------------------------------------------------


def test_a_slow_cold_start_does_not_fail_the_sync_at_the_servers_timeout(runs):
    call_command(
        "mcp_add", "slow", "--command", f"python {COUNTING} {runs.path} --start-delay 3",
        "--timeout-ms", "1000", stdout=io.StringIO(),
    )  # fmt: skip
    call_command("mcp_sync", "slow", stdout=io.StringIO())
    assert McpServer.objects.get(name="slow").last_error == ""


def test_a_call_that_times_out_while_the_server_starts_leaves_the_start_to_the_next_call(runs):
    add("slow", f"python {COUNTING} {runs.path} --start-delay 3", timeout_ms=2000)
    enable("mcp__slow__pid")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__slow__pid")
    pool.close_server("slow")  # the next call starts the server cold
    first = agent.invoke("mcp__slow__pid").json()
    assert first["errorCode"] == "timeout", first
    time.sleep(6)  # the start it began goes on (3 s, and Python's own) and is done by now
    second = agent.invoke("mcp__slow__pid").json()
    assert second["ok"] is True, second


def test_a_server_that_hangs_at_start_up_fails_after_the_start_timeout_and_others_go_on(
    monkeypatch, runs
):
    add("well", f"python {COUNTING} {runs.path}")  # started (under the default bound)
    enable("mcp__well__bump")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__well__bump")
    monkeypatch.setattr(sessions, "START_S", 3.0)
    call_command(
        "mcp_add", "stuck", "--command", f"python {COUNTING} {runs.path} --start-delay 600",
        "--timeout-ms", "1000", stdout=io.StringIO(),
    )  # fmt: skip
    failures: list[Exception] = []

    def sync_stuck() -> None:
        try:
            call_command("mcp_sync", "stuck", stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError as exc:
            failures.append(exc)

    started = time.monotonic()
    syncing = threading.Thread(target=in_thread(sync_stuck))
    syncing.start()
    while syncing.is_alive():
        began = time.monotonic()
        assert bump(agent, "meanwhile", server="well")["ok"] is True
        assert time.monotonic() - began < 2  # the other server does not wait for it
        time.sleep(0.2)
    assert 2.5 < time.monotonic() - started < 10
    assert failures
    assert McpServer.objects.get(name="stuck").last_error == (
        "listing failed: the server did not start within 3 s"
    )


# -- the server's timeout applies to its tools -----------------------------------------


def test_a_timeout_changed_in_the_admin_applies_to_the_next_call(root_client, runs):
    server = add("count", f"python {COUNTING} {runs.path}", timeout_ms=10000)
    enable("mcp__count__bump_slowly")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__count__bump_slowly")
    response = root_client.post(
        reverse("admin:mcp_mcpserver_change", args=[server.pk]),
        {
            "name": "count",
            "transport": "stdio",
            "command": server.command,
            "enabled": "on",
            "timeout_ms": "1000",
            "credentials-TOTAL_FORMS": "0",
            "credentials-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    body = agent.invoke("mcp__count__bump_slowly", args={"seconds": 3}).json()
    assert body["errorCode"] == "timeout", body
    assert body["safeMessage"] == "The tool did not finish within 1 s."


def test_a_timeout_changed_by_mcp_add_applies_to_the_next_call(runs):
    add("count", f"python {COUNTING} {runs.path}", timeout_ms=10000)
    enable("mcp__count__bump_slowly")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__count__bump_slowly")
    call_command(
        "mcp_add", "count", "--command", f"python {COUNTING} {runs.path}",
        "--timeout-ms", "1000", stdout=io.StringIO(),
    )  # fmt: skip
    body = agent.invoke("mcp__count__bump_slowly", args={"seconds": 3}).json()
    assert body["errorCode"] == "timeout", body


def test_mcp_add_without_a_timeout_keeps_the_servers_timeout():
    call_command(
        "mcp_add", "time", "--command", "mcp-server-time", "--timeout-ms", "4000",
        stdout=io.StringIO(),
    )  # fmt: skip
    call_command("mcp_add", "time", "--command", "mcp-server-time --local-timezone UTC")
    assert McpServer.objects.get(name="time").timeout_ms == 4000
    call_command("mcp_add", "other", "--command", "mcp-server-time", stdout=io.StringIO())
    assert McpServer.objects.get(name="other").timeout_ms == 15000
