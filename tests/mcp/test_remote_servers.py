"""Software nobody here wrote: an SDK server over streamable HTTP, mcp-server-git over stdio."""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

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
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]


@pytest.fixture
def seen(tmp_path: Path) -> Callable[[], list[str]]:
    """The Authorization headers the test server received, one per tool call."""
    path = tmp_path / "seen.txt"
    return lambda: path.read_text().splitlines() if path.exists() else []


@contextmanager
def serving(tmp_path: Path, **env: str) -> Iterator[str]:
    """tests/mcp/servers/http_server.py on a free port, with these extra variables."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, f"{SERVERS}/http_server.py", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MCP_HTTP_SEEN": str(tmp_path / "seen.txt"), **env},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    try:
        yield url
    finally:
        stop(process)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    with serving(tmp_path) as url:
        yield url


def approve_and_run(approval_id: str) -> None:
    from django.contrib.auth.models import User

    boss = User.objects.filter(username="boss").first() or User.objects.create_superuser(
        "boss", password="pw-boss-123456"
    )
    decisions.decide(approval_id, boss, "approve")
    run_approved_call.call(approval_id)


def test_an_sdk_server_over_http_is_imported_called_held_and_approved(http_server):
    call_command(
        "mcp_add", "calc", "--url", http_server, "--allow-private-network", stdout=io.StringIO()
    )
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


def test_http_credentials_come_from_the_tenants_connection_not_from_arguments(http_server, seen):
    call_command(
        "mcp_add", "calc", "--url", http_server, "--allow-private-network", stdout=io.StringIO()
    )
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
    globex_body = globex.invoke("mcp__calc__whoami").json()
    assert seen() == ["Bearer acme-calc-token", "anonymous"]
    # What the server echoes of the credential reaches nobody (step 10b).
    assert acme_body["result"]["content"][0]["text"] == "Bearer [redacted]"
    assert globex_body["result"]["content"][0]["text"] == "anonymous"


TOKEN = "acme-calc-token"


def with_credential(url: str, *tools: str) -> Any:
    """The calc server imported, `tools` enabled and allowed for acme, which has a
    bearer credential for it."""
    call_command("mcp_add", "calc", "--url", url, "--allow-private-network", stdout=io.StringIO())
    call_command("mcp_sync", "calc", stdout=io.StringIO())
    tool_ids = [f"mcp__calc__{tool}" for tool in tools]
    enable(*tool_ids)
    acme = make_agent("acme")
    allow(acme.tenant, *tool_ids)
    connection = Connection(tenant=acme.tenant, name="calc", kind="bearer")
    connection.allowed_hosts = ["127.0.0.1"]
    connection.set_secret(token=TOKEN)
    connection.save()
    server = McpServer.objects.get(name="calc")
    McpServerCredential.objects.create(server=server, tenant=acme.tenant, connection=connection)
    return acme


def everything_about(run_id: str, body: Any) -> str:
    """The answer, the record and the run's events: everywhere a result goes."""
    records = list(InvocationRecord.objects.filter(run_id=run_id).values())
    events = list(RunEvent.objects.filter(run_id=run_id).values())
    return str([body, records, events])


def test_an_mcp_servers_encoded_echo_of_its_credential_is_scrubbed_everywhere(http_server, seen):
    acme = with_credential(http_server, "echo_encoded")
    body = acme.invoke("mcp__calc__echo_encoded", runId="run-echo").json()
    assert seen() == [f"Bearer {TOKEN}"]
    assert body["ok"] is True, body
    echoed = body["result"]["structuredContent"]
    assert echoed["urlsafe"] == "[redacted]" and echoed["percent"] == "Bearer%20[redacted]"
    assert "[redacted]" in echoed["base64"]  # the middle of a longer base64 text
    told = everything_about("run-echo", body)
    for form in (
        TOKEN,
        base64.b64encode(f"Bearer {TOKEN}".encode()).decode(),
        base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("="),
        quote(f"Bearer {TOKEN}", safe=""),
    ):
        assert form not in told


def test_an_mcp_error_message_quoting_the_credential_is_scrubbed(http_server, seen):
    acme = with_credential(http_server, "echo_error")
    body = acme.invoke("mcp__calc__echo_error", runId="run-error").json()
    assert seen() == [f"Bearer {TOKEN}"]
    assert body["ok"] is False and body["errorCode"] == "execution", body
    assert "refused the request with Bearer [redacted]" in body["safeMessage"]
    assert TOKEN not in everything_about("run-error", body)


def test_the_credential_sent_is_scrubbed_even_if_rotated_while_the_call_runs(http_server, seen):
    acme = with_credential(http_server, "echo_later")
    answers: list[Any] = []
    call = threading.Thread(
        target=in_thread(
            lambda: answers.append(
                acme.invoke("mcp__calc__echo_later", args={"seconds": 1.5}, runId="run-r").json()
            )
        )
    )
    call.start()
    deadline = time.monotonic() + 10
    while not seen() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen() == [f"Bearer {TOKEN}"]  # sent: now the connection is rotated
    connection = Connection.objects.get(name="calc")
    connection.set_secret(token="rotated-calc-token")
    connection.save()
    call.join(15)
    [body] = answers
    assert body["ok"] is True, body
    assert body["result"]["content"][0]["text"] == "Bearer [redacted]"
    assert TOKEN not in everything_about("run-r", body)


def test_a_call_that_sent_no_credential_keeps_its_output_as_it_came(http_server, seen):
    with_credential(http_server, "echo")
    globex = make_agent("globex", "agent:other")
    allow(globex.tenant, "mcp__calc__echo")
    body = globex.invoke("mcp__calc__echo", args={"text": f"{TOKEN} is acme's"}).json()
    assert seen() == ["anonymous"]
    assert body["result"]["content"][0]["text"] == f"{TOKEN} is acme's / anonymous"


def test_a_credential_is_never_sent_to_a_server_outside_its_allowed_hosts(http_server):
    call_command(
        "mcp_add", "calc", "--url", http_server, "--allow-private-network", stdout=io.StringIO()
    )
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
    assert "127.0.0.1" not in body["safeMessage"]  # the server's host is the deployment's


@pytest.mark.parametrize("answers", ["sse", "json"])
def test_an_answer_past_the_message_limit_fails_its_call_and_the_server_serves_on(
    answers, tmp_path
):
    """A remote server's answer is read up to MAX_MESSAGE_BYTES (1 MiB), as an SSE event
    or as a plain JSON body: a larger one fails that call without being held in memory."""
    json_response = "1" if answers == "json" else "0"
    with serving(tmp_path, MCP_HTTP_JSON_RESPONSE=json_response, MCP_HTTP_SIZED="1") as url:
        call_command(
            "mcp_add", "big", "--url", url, "--allow-private-network", stdout=io.StringIO()
        )
        call_command("mcp_sync", "big", stdout=io.StringIO())
        enable("mcp__big__sized")
        agent = make_agent("acme")
        allow(agent.tenant, "mcp__big__sized")

        small = agent.invoke("mcp__big__sized", args={"size": 1000}).json()
        assert small["ok"] is True and small["result"]["content"][0]["text"] == "x" * 1000
        huge = agent.invoke("mcp__big__sized", args={"size": 3 * 1024 * 1024}).json()
        assert huge["ok"] is False and huge["errorCode"] == "result_too_large", huge
        assert huge["safeMessage"] == (
            "big/sized: the answer is larger than toolhub's limit of 1048576 bytes."
        ), huge
        again = agent.invoke("mcp__big__sized", args={"size": 10}).json()
        assert again["ok"] is True, again


@pytest.mark.parametrize("answers", ["sse", "json"])
def test_a_listing_past_the_message_limit_fails_the_sync_with_a_clear_error(answers, tmp_path):
    json_response = "1" if answers == "json" else "0"
    with serving(tmp_path, MCP_HTTP_JSON_RESPONSE=json_response, MCP_HTTP_HUGE_LISTING="1") as url:
        call_command(
            "mcp_add", "wordy", "--url", url, "--allow-private-network", stdout=io.StringIO()
        )
        with pytest.raises(CommandError):
            call_command("mcp_sync", "wordy", stdout=io.StringIO(), stderr=io.StringIO())
    assert McpServer.objects.get(name="wordy").last_error == (
        "listing failed: the answer is larger than toolhub's limit of 1048576 bytes"
    )
    assert not Tool.objects.filter(pk__startswith="mcp__wordy__").exists()


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
        McpServer.objects.create(
            name="text",
            transport="http",
            url=f"http://127.0.0.1:{port}/mcp",
            allow_private_network=True,
        )
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
