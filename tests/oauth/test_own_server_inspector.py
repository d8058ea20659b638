"""The MCP Inspector's CLI (pinned in tests/mcp/node) signing in to toolhub's own
authorization server headless: from the 401 it reads the protected resource metadata and
the authorization server metadata, registers, and prints the authorization URL; a signed-in
tenant admin consents, the redirect reaches the Inspector's callback, and it lists tools."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import httpx2
import pytest

from tests.mcp.test_clients_inspector import inspector_node
from tests.mcp.test_server_node import node_harness
from tests.oauth.test_own_server_sdk import Browser, server, session_cookie
from tests.support.server import Server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

__all__ = ["server", "session_cookie"]

PROMPT = "Please navigate to: "
CALLBACK = "http://127.0.0.1:6276/oauth/callback"  # the Inspector's own, fixed


def lines_of(stream: object) -> tuple[queue.Queue[str], threading.Thread]:
    """The stream's lines as they come, read on a thread (so neither pipe fills up)."""
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            found.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return found, reader


@pytest.fixture
def inspector(server: Server) -> Iterator[subprocess.Popen[str]]:
    harness = node_harness()
    launcher = harness / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build"
    with tempfile.TemporaryDirectory(prefix="inspector-home-") as home:
        process = subprocess.Popen(
            [
                inspector_node(harness),
                str(launcher / "index.js"),
                "--cli",
                f"{server}/mcp/",
                "--transport",
                "http",
                "--method",
                "tools/list",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # No TTY: it prints the authorization URL instead of opening a browser
            # (there is none on PATH), then waits for the redirect on its callback port.
            env={"PATH": "/nonexistent", "HOME": home, "MCP_AUTO_OPEN_ENABLED": "true"},
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def test_the_inspector_reads_the_metadata_signs_in_and_lists_tools(
    server, session_cookie, inspector
):
    (errors, _), (output, output_read) = lines_of(inspector.stderr), lines_of(inspector.stdout)
    url = None
    while url is None:
        line = errors.get(timeout=150)
        if line.startswith(PROMPT):
            url = line[len(PROMPT) :].strip()
    assert url.startswith(f"{server}/oauth/authorize/")
    assert "code_challenge_method=S256" in url
    expected = (
        '"POST /mcp/" 401',
        '"GET /.well-known/oauth-protected-resource/mcp" 200',
        '"GET /.well-known/oauth-authorization-server" 200',
        '"POST /oauth/register/" 201',
    )
    deadline = time.monotonic() + 30  # the server's access log may reach its file later
    while True:
        log = server.output()
        missing = [seen for seen in expected if seen not in log]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert missing == [], log[-3000:]

    location = asyncio.run(Browser(server, session_cookie).consent(url, redirect=CALLBACK))
    delivered = httpx2.get(location, timeout=30)
    assert delivered.status_code == 200

    assert inspector.wait(timeout=120) == 0
    output_read.join(timeout=10)
    out = "".join(output.get_nowait() for _ in range(output.qsize()))
    listed = json.loads(out)
    assert [tool["name"] for tool in listed["tools"]] == ["core__get_current_time"]
