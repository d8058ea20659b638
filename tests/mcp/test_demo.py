"""The demo (`make run` runs seed_demo): the reference MCP time server, imported, enabled
and called through the runner with the demo's key, like the built-in tools."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord, RunEvent
from apps.mcp.models import McpServer, McpTool
from apps.policies.models import Policy
from apps.tools.models import Effect, Tool

pytestmark = pytest.mark.django_db(transaction=True)
TIME_TOOL = "mcp__time__get_current_time"


@pytest.fixture(autouse=True)
def demo_allowlist(settings: object) -> None:
    settings.TOOLHUB_MCP_STDIO_COMMANDS = ["mcp-server-time"]  # type: ignore[attr-defined]  # as scripts/run


def seed(key_file: Path) -> str:
    out = io.StringIO()
    call_command("seed_demo", "--key-file", str(key_file), stdout=out)
    return out.getvalue()


def demo_client(key_file: Path) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_file.read_text().strip()}")
    return client


def test_the_demo_key_lists_and_calls_the_time_servers_tool_through_the_runner(tmp_path):
    key_file = tmp_path / "demo_key"
    output = seed(key_file)
    assert "MCP time server skipped" not in output
    client = demo_client(key_file)
    tools = {tool["id"]: tool for tool in client.get("/api/v1/tools/").json()["tools"]}
    assert TIME_TOOL in tools and "core__get_current_time" in tools
    assert tools[TIME_TOOL]["effect"] == Effect.READ_ONLY
    assert tools[TIME_TOOL]["requiresApproval"] is False
    response = client.post(
        "/api/v1/invocations/",
        {"toolId": TIME_TOOL, "args": {"timezone": "Europe/Paris"}, "runId": "run-demo-time"},
        format="json",
    )
    body = response.json()
    assert response.status_code == 200 and body["ok"] is True, body
    assert "Europe/Paris" in body["result"]["content"][0]["text"]
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert (record.tool_id, record.status, record.principal) == (
        TIME_TOOL,
        "succeeded",
        "agent:demo",
    )
    kinds = list(RunEvent.objects.filter(run_id="run-demo-time").values_list("type", flat=True))
    assert kinds == ["tool_call_start", "tool_call_result"]


def test_running_seed_demo_twice_changes_nothing(tmp_path):
    key_file = tmp_path / "demo_key"
    seed(key_file)

    def state() -> tuple[object, ...]:
        policy = Policy.objects.get(tenant__slug="demo")
        return (
            key_file.read_text(),
            list(McpServer.objects.values_list("name", "command")),
            sorted(McpTool.objects.values_list("tool_id", "effect", "accepted_hash")),
            sorted(Tool.objects.filter(pk__startswith="mcp__").values_list("pk", "enabled")),
            sorted(policy.tools.values_list("pk", flat=True)),
            Policy.objects.count(),
        )

    first = state()
    assert (TIME_TOOL, True) in first[3]
    seed(key_file)
    assert state() == first
