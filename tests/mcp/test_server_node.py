"""toolhub's /mcp/ driven by the official TypeScript SDK client (tests/mcp/node), run with node.

The client is the SDK's v2 line (@modelcontextprotocol/client, node >= 20; its 1.x package
@modelcontextprotocol/sdk is superseded) with its tasks extension
(@modelcontextprotocol/ext-tasks), pinned in tests/mcp/node/package.json.
"""

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
    """The harness with its pinned packages installed: npm install on a fresh checkout, and
    again when package.json or package-lock.json is newer than what node_modules holds."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed; the MCP server tests need node 20+")
    if not harness_installed():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return NODE_DIR


def harness_installed() -> bool:
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    if not installed.is_file():
        return False
    pinned = max(
        (NODE_DIR / name).stat().st_mtime for name in ("package.json", "package-lock.json")
    )
    return installed.stat().st_mtime >= pinned


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    # The embedded worker runs approved calls, so a task can complete.
    env = {"TOOLHUB_MCP_PAGE_SIZE": str(PAGE_SIZE), "TOOLHUB_EMBEDDED_WORKER": "1"}
    with daphne(env) as base:
        yield base


def drive(server: Server, key: str, negotiation: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", str(node_harness() / "client.mjs"), server, key, negotiation],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# The SDK's default opens a session with initialize (2025-11-25); "auto" asks
# server/discover first and speaks 2026-07-28, one POST per request and no session.
NEGOTIATED = {"legacy": "2025-11-25", "auto": "2026-07-28"}


@pytest.mark.parametrize("negotiation", sorted(NEGOTIATED))
def test_the_typescript_sdk_client_lists_calls_and_is_refused_without_a_key(
    server, test_tools, negotiation
):
    agent = make_agent("demo", "agent:node")
    allow(agent.tenant, *CORE_TOOLS, "test__echo", "test__confirm")
    # Executable but in no policy: the policy denies it, not the permission.
    assign_perm(
        "tools.execute_tool", agents_group(agent.tenant), Tool.objects.get(pk="test__sleep")
    )

    out = drive(server, agent.key, negotiation)

    assert out["protocolVersion"] == NEGOTIATED[negotiation]
    assert out["serverInfo"]["name"] == "toolhub"
    assert out["capabilities"]["tools"]["listChanged"] is True
    names = [t["name"] for t in out["tools"]]
    assert names == sorted([*CORE_TOOLS, "test__echo", "test__confirm"])
    assert out["pages"] == -(-len(names) // PAGE_SIZE) and out["nextCursor"] is None
    confirm = next(t for t in out["tools"] if t["name"] == "test__confirm")
    assert confirm["annotations"]["readOnlyHint"] is False
    assert confirm["annotations"]["openWorldHint"] is True

    assert out["time"]["isError"] is False
    assert out["time"]["structuredContent"]["result"]["timezone"] == "UTC"
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
    assert "text: Input should be a valid string" in out["badArguments"]["content"][0]["text"]

    # An unknown tool is a JSON-RPC error the SDK raises, and nothing is recorded.
    assert out["unknown"]["error"] == "ProtocolError"
    assert out["unknown"]["code"] == -32602
    assert "nope__missing" in out["unknown"]["message"]
    assert not InvocationRecord.objects.filter(tool_id="nope__missing").exists()

    runs = set(
        InvocationRecord.objects.exclude(run_id="run_from_node").values_list("run_id", flat=True)
    )
    # 2025-11-25: one run per MCP session. 2026-07-28 has no session: an unnamed call is a
    # run of its own, and a client keeps one run by naming it (as runId below).
    assert len(runs) == (1 if negotiation == "legacy" else 5)
    assert InvocationRecord.objects.filter(run_id="run_from_node").count() == 1
    assert InvocationRecord.objects.count() == 6

    for refused in (out["noKey"], out["badKey"]):
        assert refused["connected"] is False and refused["error"] == "SdkHttpError"
        assert refused["status"] == 401
        assert refused["wwwAuthenticate"].startswith("Bearer")
        if negotiation == "legacy":
            assert "Authentication required" in refused["message"]
        else:  # the probe (server/discover) is what was refused
            assert "requires authorization (HTTP 401)" in refused["message"]


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
        # The operator decides through the REST API while the client waits on the task.
        browser.decide(str(record.approval.pk), decision, "not today")
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    settled = json.loads(out.splitlines()[-1])
    assert settled["kind"] == "task"
    assert settled["events"][0]["status"] == "working"
    outcome = settled["outcome"]
    if decision == "approve":
        assert outcome["status"] == "completed"
        assert outcome["result"]["isError"] is False
        assert outcome["result"]["structuredContent"]["invocationId"] == created["taskId"]
        assert outcome["result"]["structuredContent"]["status"] == "succeeded"
    else:
        assert outcome["status"] == "failed"
        assert "approval_rejected: not today" in outcome["error"]
