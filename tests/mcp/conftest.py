"""MCP servers for the tests: real ones from PyPI and tests/mcp/servers/, over stdio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command

from apps.mcp.models import McpServer, McpTool
from apps.mcp.sessions import pool

SERVERS = "tests/mcp/servers"


@pytest.fixture(autouse=True)
def stdio_allowlist(settings: object) -> None:
    settings.TOOLHUB_MCP_STDIO_COMMANDS = ["mcp-server-time", "mcp-server-git", "python"]  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def fresh_sessions() -> Iterator[None]:
    yield
    pool.close_all()  # no session outlives its test's server rows


def add(name: str, command: str, timeout_ms: int = 5000) -> McpServer:
    call_command("mcp_add", name, "--command", command, "--timeout-ms", str(timeout_ms))
    call_command("mcp_sync", name)
    return McpServer.objects.get(name=name)


def enable(*tool_ids: str) -> None:
    for row in McpTool.objects.filter(tool_id__in=tool_ids).select_related("tool"):
        row.tool.enabled = True
        row.tool.save(update_fields=["enabled"])
