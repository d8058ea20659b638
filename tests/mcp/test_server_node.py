"""toolhub's /mcp/ driven by the official TypeScript SDK client (tests/mcp/node), run with node."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from guardian.shortcuts import assign_perm

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord, Status
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from tests.conftest import CORE_TOOLS, allow, make_agent
from tests.streams.conftest import logged_in, operator
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

NODE_DIR = Path(__file__).with_name("node")
PAGE_SIZE = 4


def node_harness() -> Path:
    """The harness with its pinned SDK installed (npm install on a fresh checkout)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed; the MCP server tests need node 20+")
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return NODE_DIR


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    # The embedded worker runs approved calls, so a task can complete.
    env = {"TOOLHUB_MCP_PAGE_SIZE": str(PAGE_SIZE), "TOOLHUB_EMBEDDED_WORKER": "1"}
    with daphne(env) as base:
        yield base


def drive(server: Server, key: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", str(node_harness() / "client.mjs"), server, key],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_typescript_sdk_client_lists_calls_and_is_refused_without_a_key(server, test_tools):
    agent = make_agent("demo", "agent:node")
    allow(agent.tenant, *CORE_TOOLS, "test__echo", "test__confirm")
    # Executable but in no policy: the policy denies it, not the permission.
    assign_perm(
        "tools.execute_tool", agents_group(agent.tenant), Tool.objects.get(pk="test__sleep")
    )

    out = drive(server, agent.key)

    assert out["serverInfo"]["name"] == "toolhub"
    assert out["capabilities"]["tools"]["listChanged"] is True
    names = [t["name"] for t in out["tools"]]
    assert names == sorted([*CORE_TOOLS, "test__echo", "test__confirm"])
    assert out["pages"] == -(-len(names) // PAGE_SIZE)
    confirm = next(t for t in out["tools"] if t["name"] == "test__confirm")
    assert confirm["annotations"]["readOnlyHint"] is False
    assert confirm["annotations"]["openWorldHint"] is True

    assert out["call"]["isError"] is False
    assert json.loads(out["call"]["content"][0]["text"]) == {"text": "from node"}

    approval = ApprovalRequest.objects.get()
    held = InvocationRecord.objects.get(status=Status.PENDING_APPROVAL)
    assert out["held"]["isError"] is False
    assert str(approval.pk) in out["held"]["content"][0]["text"]
    assert out["held"]["structuredContent"]["invocationId"] == str(held.pk)

    assert out["denied"]["isError"] is True
    assert out["denied"]["structuredContent"]["errorCode"] == "policy_denied"
    assert out["badArguments"]["isError"] is True
    assert out["badArguments"]["structuredContent"]["errorCode"] == "validation"

    runs = set(
        InvocationRecord.objects.exclude(run_id="run_from_node").values_list("run_id", flat=True)
    )
    assert len(runs) == 1  # one run per MCP session
    assert InvocationRecord.objects.filter(run_id="run_from_node").count() == 1

    assert out["noKey"]["connected"] is False and out["noKey"]["status"] == 401
    assert "Authentication required" in out["noKey"]["message"]
    assert out["badKey"]["connected"] is False and out["badKey"]["status"] == 401


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_held_call_as_an_mcp_task_completes_when_it_is_decided(server, test_tools, decision):
    agent = make_agent("demo", "agent:node")
    allow(agent.tenant, "test__confirm")
    browser = logged_in(server, operator("olga", agent.tenant, decide=("test__confirm",)))
    script = node_harness() / "task.mjs"
    process = subprocess.Popen(
        ["node", str(script), server, agent.key, "test__confirm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        created = json.loads(process.stdout.readline())["taskCreated"]
        record = InvocationRecord.objects.get(pk=created["taskId"])
        assert created["status"] == "working" and record.status == Status.PENDING_APPROVAL
        assert str(record.approval.pk) in created["statusMessage"]
        browser.decide(str(record.approval.pk), decision, "not today")
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    messages = json.loads(out.splitlines()[-1])["messages"]
    statuses = [m["task"]["status"] for m in messages if m["type"] == "taskStatus"]
    assert statuses[-1] == ("completed" if decision == "approve" else "failed")
    if decision == "approve":
        result = messages[-1]
        assert result["type"] == "result" and result["result"]["isError"] is False
        assert result["result"]["structuredContent"]["invocationId"] == created["taskId"]
    else:
        last_status = [m for m in messages if m["type"] == "taskStatus"][-1]
        assert last_status["task"]["statusMessage"] == "approval_rejected: not today"
        assert messages[-1]["type"] == "error"
