"""Software nobody here wrote: an SDK server over streamable HTTP, mcp-server-git over stdio."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.approvals.tasks import run_approved_call
from apps.connections.models import Connection
from apps.invocations.models import InvocationRecord, RunEvent
from apps.mcp.discovery import apply_to_catalog
from apps.mcp.models import McpServer, McpServerCredential, McpTool
from apps.policies.models import Policy
from apps.tools.models import Effect, Tool
from tests.conftest import allow, make_agent
from tests.mcp.conftest import SERVERS, add, enable
from tests.support.processes import stop
from tests.support.server import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def http_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, f"{SERVERS}/http_server.py", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    import socket

    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield url
    stop(process)


def approve_and_run(approval_id: str) -> None:
    from django.contrib.auth.models import User

    boss = User.objects.filter(username="boss").first() or User.objects.create_superuser(
        "boss", password="pw-boss-123456"
    )
    decisions.decide(approval_id, boss, "approve")
    run_approved_call.call(approval_id)


def test_an_sdk_server_over_http_is_imported_called_held_and_approved(http_server):
    call_command("mcp_add", "calc", "--url", http_server, stdout=io.StringIO())
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    add_id = "mcp__calc__add"
    assert Tool.objects.get(pk=add_id).enabled is False
    enable(add_id)
    agent = make_agent("acme")
    policy = allow(agent.tenant, add_id)
    body = agent.invoke(add_id, args={"a": 2, "b": 3}, runId="run-calc").json()
    assert body["ok"] is True, body
    assert body["result"]["content"][0]["text"] == "5"
    # The default effect of an import is external_side_effect: a policy that holds those holds it.
    policy.approval_effects = [Effect.EXTERNAL_SIDE_EFFECT]
    policy.save()
    held = agent.invoke(add_id, args={"a": 4, "b": 4}, runId="run-calc-held")
    assert held.status_code == 202, held.json()
    approve_and_run(held.json()["approvalId"])
    record = InvocationRecord.objects.get(pk=held.json()["invocationId"])
    assert record.status == "succeeded" and record.result["content"][0]["text"] == "8"
    kinds = list(RunEvent.objects.filter(run_id="run-calc-held").values_list("type", flat=True))
    assert kinds == ["approval_required", "approval_decided", "tool_call_start", "tool_call_result"]


def test_http_credentials_come_from_the_tenants_connection_not_from_arguments(http_server):
    call_command("mcp_add", "calc", "--url", http_server, stdout=io.StringIO())
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    enable("mcp__calc__whoami")
    acme, globex = make_agent("acme"), make_agent("globex", "agent:other")
    for agent in (acme, globex):
        allow(agent.tenant, "mcp__calc__whoami")
    connection = Connection(tenant=acme.tenant, name="calc", kind="bearer")
    connection.allowed_hosts = ["127.0.0.1"]
    connection.set_secret(token="acme-calc-token")
    connection.save()
    server = McpServer.objects.get(name="calc")
    McpServerCredential.objects.create(server=server, tenant=acme.tenant, connection=connection)
    acme_body = acme.invoke("mcp__calc__whoami").json()
    assert acme_body["result"]["content"][0]["text"] == "Bearer acme-calc-token"
    globex_body = globex.invoke("mcp__calc__whoami").json()
    assert globex_body["result"]["content"][0]["text"] == "anonymous"


def test_a_credential_is_never_sent_to_a_server_outside_its_allowed_hosts(http_server):
    call_command("mcp_add", "calc", "--url", http_server, stdout=io.StringIO())
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    enable("mcp__calc__whoami")
    acme = make_agent("acme")
    allow(acme.tenant, "mcp__calc__whoami")
    connection = Connection(tenant=acme.tenant, name="calc", kind="bearer")
    connection.allowed_hosts = ["api.example.com"]
    connection.set_secret(token="acme-calc-token")
    connection.save()
    server = McpServer.objects.get(name="calc")
    McpServerCredential.objects.create(server=server, tenant=acme.tenant, connection=connection)
    body = acme.invoke("mcp__calc__whoami").json()
    assert body["ok"] is False and body["errorCode"] == "unavailable", body
    assert "allowed hosts" in body["safeMessage"]
    assert "acme-calc-token" not in str(body)


def test_a_url_that_does_not_speak_mcp_fails_the_sync_with_a_clear_error(tmp_path):
    port = free_port()
    (tmp_path / "mcp").write_text("this is not JSON, nor MCP")
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1)
        McpServer.objects.create(name="text", transport="http", url=f"http://127.0.0.1:{port}/mcp")
        with pytest.raises(CommandError):
            call_command("mcp_sync", "text", stdout=io.StringIO(), stderr=io.StringIO())
        assert McpServer.objects.get(name="text").last_error.startswith("listing failed")
        assert not Tool.objects.filter(pk__startswith="mcp__text__").exists()
    finally:
        stop(process)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (repo / "a.txt").write_text("hello\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    return repo


def test_mcp_server_git_reads_run_and_writes_wait_for_approval(repository):
    add("git", f"mcp-server-git --repository {repository}", timeout_ms=10000)
    status, add_tool = "mcp__git__git_status", "mcp__git__git_add"
    for tool_id, effect in ((status, Effect.READ_ONLY), (add_tool, Effect.EXTERNAL_SIDE_EFFECT)):
        row = McpTool.objects.get(tool_id=tool_id)
        row.effect = effect
        apply_to_catalog(row)
    enable(status, add_tool)
    agent = make_agent("acme")
    policy = allow(agent.tenant, status, add_tool)
    Policy.objects.filter(pk=policy.pk).update(approval_effects=[Effect.EXTERNAL_SIDE_EFFECT])
    (repository / "b.txt").write_text("new\n")
    read = agent.invoke(status, args={"repo_path": str(repository)}).json()
    assert read["ok"] is True, read
    assert "b.txt" in read["result"]["content"][0]["text"]
    write = agent.invoke(add_tool, args={"repo_path": str(repository), "files": ["b.txt"]})
    assert write.status_code == 202
    assert ApprovalRequest.objects.get(pk=write.json()["approvalId"]).status == "pending"
    staged = subprocess.run(
        ["git", "-C", str(repository), "diff", "--cached", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert staged.stdout == ""  # nothing ran while it waits
    approve_and_run(write.json()["approvalId"])
    staged = subprocess.run(
        ["git", "-C", str(repository), "diff", "--cached", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert staged.stdout.split() == ["b.txt"]
