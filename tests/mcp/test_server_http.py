"""`/mcp/` at the HTTP level: who gets in, and how protocol mistakes are answered."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest

from apps.tenants.models import ApiKey
from tests.conftest import allow, make_agent
from tests.support.deep_json import DEEP_ARRAYS, DEEP_OBJECTS, OVER_DEPTH, TOO_DEEP
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

INIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
ACCEPT = "application/json, text/event-stream"


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    """One Daphne per test: a process that outlived a test would keep caches (content
    type ids...) of rows the test database no longer has."""
    with daphne({"TOOLHUB_MAX_REQUEST_BYTES": "4096", "TOOLHUB_WS_MAX_PER_PRINCIPAL": "1"}) as base:
        yield base


def post(server: Server, body: Any, key: str | None, **headers: str) -> httpx2.Response:
    sent = {"Accept": ACCEPT, "Content-Type": "application/json", **headers}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx2.post(f"{server}/mcp/", content=content, headers=sent, timeout=30)


def start(server: Server, key: str) -> str:
    response = post(server, INIT, key)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["protocolVersion"] == "2025-06-18"
    return response.headers["mcp-session-id"]


def rpc(server: Server, key: str, session: str, method: str, params: Any = None) -> Any:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        body["params"] = params
    return post(server, body, key, **{"Mcp-Session-Id": session})


def test_it_refuses_a_request_without_a_key_with_401(server):
    response = post(server, INIT, None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_it_refuses_a_wrong_or_revoked_key_with_401(server, agent):
    assert post(server, INIT, "th_nope_nothing").status_code == 401
    assert post(server, INIT, None, Authorization=f"Basic {agent.key}").status_code == 401
    ApiKey.objects.filter(tenant=agent.tenant).get().revoke()
    assert post(server, INIT, agent.key).status_code == 401


def test_a_session_belongs_to_the_key_that_started_it(server, agent, stranger):
    session = start(server, agent.key)
    assert rpc(server, agent.key, session, "ping").json()["result"] == {}
    assert rpc(server, stranger.key, session, "ping").status_code == 404
    assert rpc(server, agent.key, session + "x", "ping").status_code == 404
    missing = post(server, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, agent.key)
    assert missing.status_code == 400


@pytest.fixture
def roomy_server(transactional_db: None) -> Iterator[Server]:
    """A Daphne with the default body limit (1 MiB): room for 20,000 brackets."""
    with daphne() as base:
        yield base


def test_json_nested_too_deeply_is_a_parse_error_and_logs_no_traceback(roomy_server, agent):
    session = start(roomy_server, agent.key)
    parse_error = {"code": -32700, "message": f"Parse error. {TOO_DEEP}"}
    for text in (DEEP_ARRAYS, DEEP_OBJECTS, OVER_DEPTH):
        for headers in ({}, {"Mcp-Session-Id": session}):
            response = post(roomy_server, text.encode(), agent.key, **headers)
            assert response.status_code == 400
            assert response.json() == {"jsonrpc": "2.0", "id": None, "error": parse_error}
    assert "Traceback" not in roomy_server.output()


def test_protocol_mistakes_are_json_rpc_errors(server, agent):
    session = start(server, agent.key)
    headers = {"Mcp-Session-Id": session}
    parse = post(server, b"{not json", agent.key, **headers)
    assert parse.status_code == 400 and parse.json()["error"]["code"] == -32700
    batch = post(server, [{"jsonrpc": "2.0", "id": 1, "method": "ping"}], agent.key, **headers)
    assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600
    unknown = rpc(server, agent.key, session, "resources/list")
    assert unknown.status_code == 200 and unknown.json()["error"]["code"] == -32601
    cursor = rpc(server, agent.key, session, "tools/list", {"cursor": "bm9wZQ=="})
    assert cursor.json()["error"]["code"] == -32602
    args = rpc(server, agent.key, session, "tools/call", {"name": "x", "arguments": [1]})
    assert args.json()["error"]["code"] == -32602
    run_id = rpc(
        server,
        agent.key,
        session,
        "tools/call",
        {"name": "core__get_current_time", "_meta": {"runId": "no spaces allowed"}},
    )
    assert (
        run_id.json()["error"]["code"] == -32602 and "run_id" in run_id.json()["error"]["message"]
    )


def test_a_notification_is_accepted_with_202(server, agent):
    session = start(server, agent.key)
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = post(server, notice, agent.key, **{"Mcp-Session-Id": session})
    assert response.status_code == 202 and response.content == b""


def test_it_refuses_an_unsupported_protocol_version_header(server, agent):
    session = start(server, agent.key)
    response = post(
        server,
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
        agent.key,
        **{"Mcp-Session-Id": session, "MCP-Protocol-Version": "1999-01-01"},
    )
    assert response.status_code == 400


def test_delete_is_405_because_sessions_end_with_their_key(server, agent):
    session = start(server, agent.key)
    response = httpx2.delete(
        f"{server}/mcp/",
        headers={"Authorization": f"Bearer {agent.key}", "Mcp-Session-Id": session},
    )
    assert response.status_code == 405


def test_a_page_of_another_site_is_refused(server, agent):
    response = post(server, INIT, agent.key, Origin="http://evil.example")
    assert response.status_code == 403
    same_site = post(server, INIT, agent.key, Origin=server)
    assert same_site.status_code == 200


def test_the_body_limit_applies_to_mcp(server, agent):
    huge = json.dumps({**INIT, "pad": "x" * 10_000}).encode()
    assert post(server, huge, agent.key).status_code == 413


def test_the_event_stream_needs_a_session_and_ends_when_the_key_is_revoked(server, agent):
    headers = {"Authorization": f"Bearer {agent.key}", "Accept": "text/event-stream"}
    assert httpx2.get(f"{server}/mcp/", headers=headers, timeout=10).status_code == 400
    session = start(server, agent.key)
    headers["Mcp-Session-Id"] = session
    with httpx2.stream("GET", f"{server}/mcp/", headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        assert next(lines).startswith(": toolhub")
        started = time.monotonic()
        ApiKey.objects.filter(tenant=agent.tenant).get().revoke()
        for _ in lines:  # ends when the server closes the stream; keepalives every 15 s
            if time.monotonic() - started > 12:
                break
        assert time.monotonic() - started < 10


def test_tasks_are_the_callers_own_and_a_held_one_can_be_cancelled(server, test_tools):
    agent = make_agent("demo", "agent:one")
    other = make_agent("demo", "agent:two")
    allow(agent.tenant, "test__confirm")
    init = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-11-25"}}
    sessions = [post(server, init, a.key).headers["mcp-session-id"] for a in (agent, other)]
    call = {"name": "test__confirm", "arguments": {}, "task": {"ttl": 60000}}
    task = rpc(server, agent.key, sessions[0], "tools/call", call).json()["result"]["task"]
    assert task["status"] == "working", task.get("statusMessage")

    stolen = rpc(server, other.key, sessions[1], "tasks/get", {"taskId": task["taskId"]})
    assert stolen.json()["error"]["code"] == -32602
    refused = rpc(server, other.key, sessions[1], "tasks/cancel", {"taskId": task["taskId"]})
    assert refused.json()["error"]["code"] == -32602

    cancelled = rpc(server, agent.key, sessions[0], "tasks/cancel", {"taskId": task["taskId"]})
    assert cancelled.json()["result"]["status"] == "cancelled"
    again = rpc(server, agent.key, sessions[0], "tasks/cancel", {"taskId": task["taskId"]})
    assert again.json()["error"]["code"] == -32602
    result = rpc(server, agent.key, sessions[0], "tasks/result", {"taskId": task["taskId"]})
    assert result.json()["result"]["structuredContent"]["errorCode"] == "cancelled"


def test_open_streams_count_against_the_principals_stream_cap(server, agent):
    session = start(server, agent.key)
    headers = {
        "Authorization": f"Bearer {agent.key}",
        "Accept": "text/event-stream",
        "Mcp-Session-Id": session,
    }
    with httpx2.stream("GET", f"{server}/mcp/", headers=headers, timeout=30) as first:
        assert first.status_code == 200
        second = httpx2.get(f"{server}/mcp/", headers=headers, timeout=10)
        assert second.status_code == 429 and second.headers["retry-after"] == "5"
    for _ in range(50):  # the first stream's slot is freed once the server sees it close
        with httpx2.stream("GET", f"{server}/mcp/", headers=headers, timeout=30) as again:
            if again.status_code == 200:
                break
        time.sleep(0.1)
    assert again.status_code == 200


def test_a_stopping_server_ends_its_event_streams_and_task_waits_then_exits(server, test_tools):
    """An event stream and a `tasks/result` waiting for a held call only wait, on the loop:
    they would hold a stopping server for as long as their clients stay. SIGTERM ends
    the stream (the client reconnects elsewhere) and answers the wait with an error that
    says to ask again (toolhub/server/draining.py)."""
    agent = make_agent("demo", "agent:one")
    allow(agent.tenant, "test__confirm")
    init = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-11-25"}}
    session = post(server, init, agent.key).headers["mcp-session-id"]
    call = {"name": "test__confirm", "arguments": {}, "task": {"ttl": 60000}}
    task = rpc(server, agent.key, session, "tools/call", call).json()["result"]["task"]
    assert task["status"] == "working", task.get("statusMessage")
    headers = {
        "Authorization": f"Bearer {agent.key}",
        "Accept": "text/event-stream",
        "Mcp-Session-Id": session,
    }
    ended: dict[str, float] = {}

    def stream() -> None:
        # Keepalives come every 15 s: a read timeout of 10 s ends a stream left open.
        with httpx2.stream("GET", f"{server}/mcp/", headers=headers, timeout=10) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                pass
        ended["stream"] = time.monotonic()

    with ThreadPoolExecutor(2) as pool:
        streaming = pool.submit(stream)
        waiting = pool.submit(
            rpc, server, agent.key, session, "tasks/result", {"taskId": task["taskId"]}
        )
        time.sleep(1.5)  # both are waiting
        assert not streaming.done() and not waiting.done()
        stopped = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        answer = waiting.result(timeout=10)
        streaming.result(timeout=10)
    assert answer.status_code == 200
    assert answer.json()["error"] == {
        "code": -32603,
        "message": "The server is restarting: ask for this task's result again.",
    }
    assert ended["stream"] - stopped < 5
    assert server.process.wait(timeout=10) == 0, server.output()[-3000:]


def test_an_unknown_tool_is_invalid_params_and_leaves_no_record(server, agent):
    from apps.invocations.models import InvocationRecord

    session = start(server, agent.key)
    response = rpc(server, agent.key, session, "tools/call", {"name": "core__no_such_tool"})
    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == -32602 and "Unknown tool: core__no_such_tool" in error["message"]
    assert not InvocationRecord.objects.filter(tool_ref="core__no_such_tool").exists()
    # A tool that exists is the runner's to answer (here: its arguments are missing).
    known = rpc(server, agent.key, session, "tools/call", {"name": "core__get_current_time"})
    assert "result" in known.json() and "error" not in known.json()


@pytest.mark.parametrize("origin", [None, "http://evil.example"])
def test_a_host_that_is_not_this_servers_is_refused_with_or_without_an_origin(
    server, agent, origin
):
    headers = {"Host": "rebound.evil.example"}
    if origin:
        headers["Origin"] = origin
    response = post(server, INIT, agent.key, **headers)
    assert response.status_code == 421
    assert response.json()["error"]["message"] == "This Host may not use /mcp/."
    stream = httpx2.get(f"{server}/mcp/", headers=headers, timeout=10)
    assert stream.status_code == 421


def start_legacy(server: Server, key: str) -> str:
    init = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-03-26"}}
    response = post(server, init, key)
    assert response.json()["result"]["protocolVersion"] == "2025-03-26"
    return response.headers["mcp-session-id"]


def test_a_2025_03_26_session_may_send_a_batch_answered_in_order(server, agent):
    session = start_legacy(server, agent.key)
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "b", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "nope"}},
        {"jsonrpc": "2.0", "id": "d", "method": "initialize", "params": INIT["params"]},
        "not a message",
    ]
    response = post(server, batch, agent.key, **{"Mcp-Session-Id": session})
    assert response.status_code == 200, response.text
    answers = response.json()
    assert [answer.get("id") for answer in answers] == ["a", "b", "c", "d", None]
    assert answers[0]["result"] == {}
    assert "tools" in answers[1]["result"]
    assert answers[2]["error"]["code"] == -32602
    assert answers[3]["error"]["code"] == -32600  # initialize may not be batched
    assert answers[4]["error"]["code"] == -32600
    only_notices = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
    quiet = post(server, only_notices, agent.key, **{"Mcp-Session-Id": session})
    assert quiet.status_code == 202 and quiet.content == b""
    empty = post(server, [], agent.key, **{"Mcp-Session-Id": session})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == -32600


def test_a_batch_outside_a_2025_03_26_session_is_refused(server, agent):
    ping = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]
    newer = start(server, agent.key)
    for headers in ({"Mcp-Session-Id": newer}, {}):
        response = post(server, ping, agent.key, **headers)
        assert response.status_code == 400
        assert "2025-03-26" in response.json()["error"]["message"]
