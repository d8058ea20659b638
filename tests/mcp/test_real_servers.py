"""MCP servers nobody here wrote, imported and called through toolhub.

- `@modelcontextprotocol/server-everything` (the reference server "for builders of MCP
  clients") over stdio and over streamable HTTP: images, structured content, titles and
  annotations, a long-running tool whose progress reaches an official Python SDK client
  calling through toolhub's /mcp/ on a real Daphne.
- `@modelcontextprotocol/server-filesystem` on a scratch folder: reads, a held write, a
  path outside the folder refused by the server (its `isError` kept over /mcp/), an
  image past the result limit.
- `mcp-server-git` (PyPI) on a scratch repository.

The npm servers are pinned in tests/mcp/node/package.json (installed by npm on first run,
as the TypeScript SDK client of test_server_node.py) and run by their package's program
names from node_modules/.bin, as an admin would run them once installed with npm -g.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from mcp import types

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord
from apps.mcp import progress, sessions
from apps.mcp.discovery import apply_to_catalog
from apps.mcp.models import McpServer, McpTool
from apps.policies.models import Policy
from apps.tools.models import Effect
from tests.conftest import Agent, allow, make_agent
from tests.mcp.conftest import add, enable
from tests.mcp.test_remote_servers import approve_and_run
from tests.mcp.test_server import connected, run
from tests.mcp.test_server_2026 import client as client_2026
from tests.mcp.test_server_http import post, rpc, start
from tests.support.processes import stop
from tests.support.server import Server, daphne, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]

NODE_BIN = Path(__file__).with_name("node") / "node_modules" / ".bin"
EVERYTHING, FILESYSTEM = "mcp-server-everything", "mcp-server-filesystem"
PROGRAMS = [EVERYTHING, FILESYSTEM, "mcp-server-git"]
LONG = "mcp__everything__trigger_long_running_operation"
IMAGE = "mcp__everything__get_tiny_image"
WEATHER = "mcp__everything__get_structured_content"
NOTE = "mcp__everything__get_annotated_message"
READ, LIST, WRITE, MEDIA = (
    "mcp__files__read_text_file",
    "mcp__files__list_directory",
    "mcp__files__write_file",
    "mcp__files__read_media_file",
)


def node_servers() -> Path:
    """node_modules/.bin with the pinned servers (npm install on a fresh checkout)."""
    if not (NODE_BIN / EVERYTHING).exists() or not (NODE_BIN / FILESYSTEM).exists():
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed; these tests need node 20+")
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"],
            cwd=NODE_BIN.parents[1],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return NODE_BIN


def search_path() -> str:
    return f"{node_servers()}{os.pathsep}{os.environ['PATH']}"


@pytest.fixture(autouse=True)
def programs(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers' programs allowed, and found on PATH by toolhub's stdio sessions."""
    settings.TOOLHUB_MCP_STDIO_COMMANDS = PROGRAMS
    monkeypatch.setenv("PATH", search_path())


def agent_for(*tool_ids: str) -> Agent:
    enable(*tool_ids)
    agent = make_agent("acme")
    allow(agent.tenant, *tool_ids)
    return agent


def listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the server did not listen")


@pytest.fixture
def everything_http() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """server-everything's streamable HTTP mode (`mcp-server-everything streamableHttp`,
    its port from PORT), its URL and process."""
    port = free_port()
    process = subprocess.Popen(
        [str(node_servers() / EVERYTHING), "streamableHttp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PORT": str(port)},
    )
    try:
        listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a test may have stopped it
        stop(process)


def add_http(name: str, url: str, timeout_ms: int = 20000) -> McpServer:
    call_command(
        "mcp_add", name, "--url", url, "--allow-private-network",
        "--timeout-ms", str(timeout_ms), stdout=io.StringIO(),
    )  # fmt: skip
    call_command("mcp_sync", name, stdout=io.StringIO())
    return McpServer.objects.get(name=name)


def texts(body: dict[str, Any]) -> list[str]:
    return [block["text"] for block in body["result"]["content"] if block["type"] == "text"]


# -- server-everything --------------------------------------------------------------


def assert_everything_is_usable(server: McpServer) -> None:
    """A sync imports its tools usable, its titles and hints kept; calls answer images,
    structured content, annotated blocks and a long-running operation's end."""
    rows = {row.remote_name: row for row in McpTool.objects.filter(server=server)}
    for name in (
        "echo", "get-annotated-message", "get-structured-content", "get-sum",
        "get-tiny-image", "trigger-long-running-operation",
    ):  # fmt: skip
        assert name in rows, sorted(rows)
    assert {name: row.unusable_reason for name, row in rows.items() if row.unusable_reason} == {}
    assert rows["get-tiny-image"].annotations["title"] == "Get Tiny Image Tool"
    assert rows["get-tiny-image"].annotations["readOnlyHint"] is True
    agent = agent_for(IMAGE, WEATHER, NOTE, LONG)

    image = agent.invoke(IMAGE).json()
    assert image["ok"] is True, image
    kinds = [block["type"] for block in image["result"]["content"]]
    assert kinds == ["text", "image", "text"]
    picture = image["result"]["content"][1]
    assert picture["mimeType"] == "image/png"
    assert base64.b64decode(picture["data"]).startswith(b"\x89PNG")

    weather = agent.invoke(WEATHER, args={"location": "Chicago"}).json()
    assert weather["result"]["structuredContent"] == {
        "temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82,
    }  # fmt: skip
    refused = agent.invoke(WEATHER, args={"location": "Paris"}).json()
    assert refused["errorCode"] == "validation", refused  # its enum, checked by toolhub

    note = agent.invoke(NOTE, args={"messageType": "error", "includeImage": True}).json()
    first, second = note["result"]["content"]
    assert first["annotations"] == {"priority": 1.0, "audience": ["user", "assistant"]}
    assert second["type"] == "image" and second["annotations"]["audience"] == ["user"]

    long = agent.invoke(LONG, args={"duration": 2, "steps": 2}).json()
    assert long["ok"] is True, long
    assert texts(long) == ["Long running operation completed. Duration: 2 seconds, Steps: 2."]


def test_server_everything_over_stdio_is_imported_and_called():
    server = add("everything", EVERYTHING, timeout_ms=20000)
    assert server.last_error == ""
    assert_everything_is_usable(server)


def test_server_everything_over_streamable_http_is_imported_and_called(everything_http):
    url, _process = everything_http
    server = add_http("everything", url)
    assert server.last_error == ""
    assert_everything_is_usable(server)


def test_a_long_running_tool_past_the_servers_timeout_fails_and_the_next_call_runs():
    add("everything", EVERYTHING, timeout_ms=1500)
    agent = agent_for(LONG, IMAGE)
    late = agent.invoke(LONG, args={"duration": 4, "steps": 2}).json()
    assert late["errorCode"] == "timeout", late
    assert agent.invoke(IMAGE).json()["ok"] is True


def test_a_server_that_hangs_at_start_up_fails_its_sync_and_others_go_on(
    everything_http, monkeypatch
):
    """server-everything over HTTP, stopped (SIGSTOP): the port accepts connections and
    nothing answers, as a hung server does. test_session_recovery.py has the stdio case."""
    url, process = everything_http
    add("working", EVERYTHING, timeout_ms=20000)
    agent = agent_for("mcp__working__get_sum")
    monkeypatch.setattr(sessions, "START_S", 3.0)
    os.kill(process.pid, signal.SIGSTOP)
    call_command("mcp_add", "stuck", "--url", url, "--allow-private-network", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("mcp_sync", "stuck", stdout=io.StringIO(), stderr=io.StringIO())
    assert McpServer.objects.get(name="stuck").last_error == (
        "listing failed: the server did not start within 3 s"
    )
    summed = agent.invoke("mcp__working__get_sum", args={"a": 2, "b": 3}).json()
    assert texts(summed) == ["The sum of 2 and 3 is 5."]
    os.kill(process.pid, signal.SIGCONT)  # it answers again: the next sync starts anew
    call_command("mcp_sync", "stuck", stdout=io.StringIO())
    assert McpServer.objects.get(name="stuck").last_error == ""


# -- progress through toolhub's /mcp/ -------------------------------------------------


@pytest.fixture
def toolhub() -> Iterator[Server]:
    env = {"TOOLHUB_MCP_STDIO_COMMANDS": ",".join(PROGRAMS), "PATH": search_path()}
    with daphne(env) as base:
        yield base


@pytest.mark.server
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_upstream_progress_reaches_an_sdk_client_calling_through_toolhub(
    transport, toolhub, everything_http
):
    if transport == "stdio":
        add("everything", EVERYTHING, timeout_ms=20000)
    else:
        add_http("everything", everything_http[0])
    agent = agent_for(LONG)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def scenario() -> Any:
        async with connected(toolhub, agent.key) as session:
            (listed,) = (await session.list_tools()).tools
            assert listed.title == "Trigger Long Running Operation Tool"  # the server's
            assert listed.annotations is not None and listed.annotations.read_only_hint
            args = {"duration": 2, "steps": 4}
            return await session.call_tool(LONG, args, progress_callback=on_progress)

    result = run(scenario())
    assert result.is_error is False
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    assert block.text == "Long running operation completed. Duration: 2 seconds, Steps: 4."
    assert seen == [(1, 4, None), (2, 4, None), (3, 4, None), (4, 4, None)]
    # REST callers are unaffected: the same tool answers JSON, its record as always.
    body = agent.invoke(LONG, args={"duration": 1, "steps": 2}).json()
    assert body["ok"] is True and texts(body)[0].startswith("Long running operation completed")


@pytest.mark.server
def test_upstream_progress_reaches_a_stateless_2026_client(toolhub):
    """MCP 2026-07-28 has no session: the POST of the call itself streams the progress."""
    add("everything", EVERYTHING, timeout_ms=20000)
    agent = agent_for(LONG)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def scenario() -> Any:
        async with client_2026(toolhub, agent.key, "2026-07-28") as connected_client:
            args = {"duration": 2, "steps": 4}
            return await connected_client.call_tool(LONG, args, progress_callback=on_progress)

    result = run(scenario())
    assert result.is_error is False
    assert [block.text for block in result.content if isinstance(block, types.TextContent)] == [
        "Long running operation completed. Duration: 2 seconds, Steps: 4."
    ]
    assert seen == [(1, 4, None), (2, 4, None), (3, 4, None), (4, 4, None)]
    (record,) = InvocationRecord.objects.filter(tool_id=LONG)
    assert record.ok is True


@pytest.mark.server
def test_a_call_with_a_progress_token_is_answered_as_an_event_stream(toolhub):
    add("everything", EVERYTHING, timeout_ms=20000)
    agent = agent_for(LONG)
    session = start(toolhub, agent.key)
    params = {"name": LONG, "arguments": {"duration": 1, "steps": 2}}
    streamed = rpc(
        toolhub, agent.key, session, "tools/call", {**params, "_meta": {"progressToken": "p-7"}}
    )
    assert streamed.status_code == 200
    assert streamed.headers["content-type"] == "text/event-stream"
    events = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    *notices, answer = events
    assert notices == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "p-7", "progress": step, "total": 2},
        }
        for step in (1, 2)
    ]
    assert answer["id"] == 7 and answer["result"]["isError"] is False
    # Without a token, or from a client that does not accept a stream: plain JSON.
    plain = rpc(toolhub, agent.key, session, "tools/call", params)
    assert plain.headers["content-type"] == "application/json"
    assert plain.json()["result"]["isError"] is False
    body = {"jsonrpc": "2.0", "id": 8, "method": "tools/call"}
    body["params"] = {**params, "_meta": {"progressToken": 3}}
    json_only = post(
        toolhub, body, agent.key, Accept="application/json", **{"Mcp-Session-Id": session}
    )
    assert json_only.headers["content-type"] == "application/json"
    assert json_only.json()["id"] == 8


def test_only_a_single_tools_call_with_a_string_or_integer_token_is_streamed():
    def body(message: Any) -> bytes:
        return json.dumps(message).encode()

    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    sse = "application/json, text/event-stream"
    assert progress.requested(sse, body({**call, "params": {"_meta": {"progressToken": 5}}})) == 5
    for token in (True, None, 1.5, {"a": 1}, ["t"]):
        sent = body({**call, "params": {"_meta": {"progressToken": token}}})
        assert progress.requested(sse, sent) is None, token
    named = body({**call, "params": {"_meta": {"progressToken": "t"}}})
    assert progress.requested("application/json", named) is None  # no stream accepted
    assert progress.requested(sse, body([json.loads(named)])) is None  # a batch
    assert progress.requested(sse, named.replace(b"tools/call", b"tools/list")) is None
    assert progress.requested(sse, b'{"progressToken": ') is None  # the transport's parse error


# -- server-filesystem ----------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
    (scratch / "docs").mkdir(parents=True)
    (scratch / "notes.txt").write_text("first line\nsecond line\n")
    (tmp_path / "secret.txt").write_text("outside the folder\n")
    return scratch


def filesystem(folder: Path) -> McpServer:
    # The server resolves symlinks (a macOS /var is /private/var): give it the real path.
    return add("files", f"{FILESYSTEM} {folder.resolve()}", timeout_ms=20000)


def test_server_filesystem_reads_lists_and_refuses_a_path_outside_its_folder(folder):
    server = filesystem(folder)
    names = set(McpTool.objects.filter(server=server).values_list("remote_name", flat=True))
    assert {"read_text_file", "list_directory", "write_file", "read_media_file"} <= names
    assert not McpTool.objects.filter(server=server).exclude(unusable_reason="").exists()
    agent = agent_for(READ, LIST)
    where = folder.resolve()

    read = agent.invoke(READ, args={"path": str(where / "notes.txt"), "head": 1}).json()
    assert texts(read) == ["first line"], read
    listed = agent.invoke(LIST, args={"path": str(where)}).json()
    assert sorted(texts(listed)[0].splitlines()) == ["[DIR] docs", "[FILE] notes.txt"]

    outside = agent.invoke(READ, args={"path": str(where.parent / "secret.txt")}).json()
    assert outside["ok"] is False and outside["errorCode"] == "execution", outside
    assert outside["safeMessage"].startswith(
        "files/read_text_file: Access denied - path outside allowed directories"
    )
    assert "result" not in outside  # REST: a failure, its message
    kept = InvocationRecord.objects.get(pk=outside["invocationId"]).result
    assert kept["isError"] is True  # the blocks, for /mcp/
    assert kept["content"][0]["text"] == outside["safeMessage"].removeprefix(
        "files/read_text_file: "
    )


def test_a_write_is_held_until_approved_then_runs(folder):
    filesystem(folder)
    row = McpTool.objects.get(tool_id=WRITE)
    assert row.effect == Effect.EXTERNAL_SIDE_EFFECT  # untrusted until an admin says so
    row.effect = Effect.STATE_CHANGE
    apply_to_catalog(row)
    agent = agent_for(WRITE)
    Policy.objects.filter(tenant=agent.tenant).update(approval_effects=[Effect.STATE_CHANGE])
    target = folder.resolve() / "docs" / "plan.txt"

    held = agent.invoke(WRITE, args={"path": str(target), "content": "step one\n"})
    assert held.status_code == 202, held.json()
    assert ApprovalRequest.objects.get(pk=held.json()["approvalId"]).status == "pending"
    assert not target.exists()  # nothing ran while it waits
    approve_and_run(held.json()["approvalId"])
    assert target.read_text() == "step one\n"
    record = InvocationRecord.objects.get(pk=held.json()["invocationId"])
    assert record.ok is True
    assert record.result["structuredContent"] == {"content": f"Successfully wrote to {target}"}


def test_an_image_past_the_result_limit_is_refused_and_other_tools_keep_working(folder):
    filesystem(folder)
    agent = agent_for(MEDIA, LIST)
    picture = folder / "big.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(40_000))
    small = folder / "small.png"
    small.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(100))

    big = agent.invoke(MEDIA, args={"path": str(picture.resolve())}).json()
    assert big["ok"] is False and big["errorCode"] == "result_too_large", big
    assert big["safeMessage"].endswith("the limit is 32768.")
    fits = agent.invoke(MEDIA, args={"path": str(small.resolve())}).json()
    assert fits["ok"] is True, fits
    assert fits["result"]["content"][0]["type"] == "image"
    assert agent.invoke(LIST, args={"path": str(folder.resolve())}).json()["ok"] is True


@pytest.mark.server
def test_a_servers_is_error_reaches_an_mcp_client_with_its_content(toolhub, folder):
    filesystem(folder)
    agent = agent_for(READ)
    outside = str(folder.resolve().parent / "secret.txt")

    async def scenario() -> Any:
        async with connected(toolhub, agent.key) as session:
            return await session.call_tool(READ, {"path": outside})

    result = run(scenario())
    assert result.is_error is True
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    assert block.text.startswith("Access denied - path outside allowed directories")
    assert "files/read_text_file" not in block.text  # the server's words, as it sent them
    assert result.meta is not None
    invocation = result.meta["toolhub/invocation"]
    assert (invocation["status"], invocation["errorCode"]) == ("failed", "execution")
    assert invocation["safeMessage"] == f"files/read_text_file: {block.text}"


# -- mcp-server-git ---------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=T", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for number in (1, 2, 3):
        (path / "log.txt").write_text(f"entry {number}\n")
        subprocess.run([*git, "add", "log.txt"], check=True)
        subprocess.run([*git, "commit", "-qm", f"commit {number}"], check=True)
    return path


def test_every_tool_of_mcp_server_git_is_usable_and_its_optional_arguments_may_be_left_out(repo):
    """test_imported_schemas.py calls git_log with its optional arguments given (null
    included); here they are left out, or given as values."""
    server = add("git", f"mcp-server-git --repository {repo}", timeout_ms=20000)
    rows = McpTool.objects.filter(server=server)
    assert rows.count() == 12
    assert not rows.exclude(unusable_reason="").exists()
    status, log, branch, create = (
        "mcp__git__git_status",
        "mcp__git__git_log",
        "mcp__git__git_branch",
        "mcp__git__git_create_branch",
    )
    agent = agent_for(status, log, branch, create)
    where = str(repo)
    assert "working tree clean" in texts(agent.invoke(status, args={"repo_path": where}).json())[0]
    every = texts(agent.invoke(log, args={"repo_path": where}).json())[0]
    assert all(f"commit {number}" in every for number in (1, 2, 3))
    last = agent.invoke(log, args={"repo_path": where, "max_count": 1}).json()
    assert "commit 3" in texts(last)[0] and "commit 1" not in texts(last)[0]
    window = {"repo_path": where, "start_timestamp": "1 week ago", "end_timestamp": "tomorrow"}
    assert "commit 2" in texts(agent.invoke(log, args=window).json())[0]
    made = agent.invoke(create, args={"repo_path": where, "branch_name": "topic"}).json()
    assert made["ok"] is True, made
    listed = texts(agent.invoke(branch, args={"repo_path": where, "branch_type": "local"}).json())
    assert "topic" in listed[0] and "main" in listed[0]
