"""/mcp/ in MCP 2026-07-28 at the HTTP level: the envelope, the routing headers, discover,
cache hints, the Tasks extension, listen, traceparent, and the bad inputs of each."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from apps.invocations.models import InvocationRecord, Status
from apps.policies.models import Policy
from apps.tools.models import Tool
from tests.conftest import Agent, allow, make_agent
from tests.support.redis import redis_server
from tests.support.server import Server, daphne
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
ACCEPT = "application/json, text/event-stream"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne({}) as base:
        yield base


@pytest.fixture
def agent(test_tools: list[str]) -> Agent:
    agent = make_agent("acme", "agent:one")
    allow(agent.tenant, "test__echo", "test__confirm")
    return agent


def meta(tasks: bool = False, **more: Any) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        **more,
    }


def request(method: str, params: dict[str, Any] | None = None, **meta_kw: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 9,
        "method": method,
        "params": {**(params or {}), "_meta": meta(**meta_kw)},
    }


def send(
    server: Server, key: str, body: Any, headers: dict[str, str] | None = None, **routing: str
) -> httpx2.Response:
    """POSTs `body` with the routing headers it implies, `routing` overriding them."""
    sent = {"Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    if isinstance(body, dict):
        sent["MCP-Protocol-Version"] = VERSION
        sent["Mcp-Method"] = str(body.get("method"))
        params = body.get("params") or {}
        name = params.get("name", params.get("taskId"))
        if name is not None:
            sent["Mcp-Name"] = str(name)
    sent.update({k.replace("_", "-"): v for k, v in routing.items()})
    sent.update(headers or {})
    return httpx2.post(
        f"{server}/mcp/", content=json.dumps(body).encode(), headers=sent, timeout=30
    )


def test_discover_says_what_the_server_speaks(server, agent):
    response = send(server, agent.key, request("server/discover"))
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["supportedVersions"] == ["2025-03-26", "2025-06-18", "2025-11-25", VERSION]
    assert result["capabilities"]["extensions"] == {TASKS: {}}
    assert result["capabilities"]["tools"] == {"listChanged": True}
    assert result["cacheScope"] == "public" and result["resultType"] == "complete"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "toolhub"
    assert "mcp-session-id" not in response.headers


def test_tools_list_is_private_to_the_key_and_fresh_for_a_short_time(server, agent):
    other = make_agent("globex", "agent:two")
    allow(other.tenant, "test__echo")
    mine = send(server, agent.key, request("tools/list")).json()["result"]
    theirs = send(server, other.key, request("tools/list")).json()["result"]
    assert mine["cacheScope"] == theirs["cacheScope"] == "private"
    assert mine["ttlMs"] == 30_000 and mine["resultType"] == "complete"
    assert [t["name"] for t in mine["tools"]] == ["test__confirm", "test__echo"]
    assert [t["name"] for t in theirs["tools"]] == ["test__echo"]


def test_routing_headers_that_disagree_with_the_body_are_refused_and_nothing_runs(server, agent):
    call = request("tools/call", {"name": "test__echo", "arguments": {"text": "x"}})
    for routing in (
        {"Mcp_Method": "tools/list"},
        {"Mcp_Name": "test__confirm"},
        {"MCP_Protocol_Version": "2025-11-25"},
    ):
        response = send(server, agent.key, call, **routing)
        assert response.status_code == 400, (routing, response.text)
        assert response.json()["error"]["code"] == -32020, routing
        assert "does not match" in response.json()["error"]["message"]
    twice = httpx2.post(
        f"{server}/mcp/",
        content=json.dumps(call).encode(),
        headers=[
            ("Authorization", f"Bearer {agent.key}"),
            ("Accept", ACCEPT),
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "test__echo"),
            ("Mcp-Name", "test__confirm"),
        ],
        timeout=30,
    )
    assert twice.status_code == 400 and twice.json()["error"]["code"] == -32020
    # A 2026-07-28 body without its header is the same mistake, not a session error.
    bare = httpx2.post(
        f"{server}/mcp/",
        content=json.dumps(call).encode(),
        headers={"Authorization": f"Bearer {agent.key}", "Accept": ACCEPT},
        timeout=30,
    )
    assert bare.status_code == 400 and bare.json()["error"]["code"] == -32020
    assert not InvocationRecord.objects.exists()


def test_a_request_with_no_protocol_version_at_all_is_told_what_to_send(server, agent):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "test__echo"}}
    response = httpx2.post(
        f"{server}/mcp/",
        content=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {agent.key}", "Accept": ACCEPT},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32600 and error["message"].startswith("No protocol version")
    # The 2026 header with a body that has no envelope: the envelope is named.
    no_meta = send(server, agent.key, body)
    assert no_meta.status_code == 400 and no_meta.json()["error"]["code"] == -32602
    assert "params._meta" in no_meta.json()["error"]["message"]
    assert not InvocationRecord.objects.exists()


def test_batches_are_refused_in_2026_and_in_a_2025_06_18_session_and_nothing_runs(server, agent):
    call = request("tools/call", {"name": "test__echo", "arguments": {"text": "x"}})
    modern = send(server, agent.key, [call, call], MCP_Protocol_Version=VERSION)
    assert modern.status_code == 400
    assert modern.json()["error"]["code"] == -32600
    assert "one JSON-RPC request per POST" in modern.json()["error"]["message"]
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "r", "version": "0"},
        },
    }
    started = httpx2.post(
        f"{server}/mcp/",
        content=json.dumps(init).encode(),
        headers={"Authorization": f"Bearer {agent.key}", "Accept": ACCEPT},
        timeout=30,
    )
    session = started.headers["mcp-session-id"]
    legacy_call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "test__echo", "arguments": {"text": "x"}},
    }
    legacy = httpx2.post(
        f"{server}/mcp/",
        content=json.dumps([legacy_call]).encode(),
        headers={
            "Authorization": f"Bearer {agent.key}",
            "Accept": ACCEPT,
            "Mcp-Session-Id": session,
        },
        timeout=30,
    )
    assert legacy.status_code == 400 and "2025-03-26" in legacy.json()["error"]["message"]
    assert not InvocationRecord.objects.exists()


def test_an_unknown_revision_is_told_the_versions_served(server, agent):
    response = send(
        server, agent.key, request("server/discover"), MCP_Protocol_Version="2027-01-01"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32022
    assert error["data"] == {
        "supported": ["2025-03-26", "2025-06-18", "2025-11-25", VERSION],
        "requested": "2027-01-01",
    }


def test_methods_of_other_revisions_are_not_found_and_get_is_not_allowed(server, agent):
    for method in ("ping", "initialize", "tasks/result"):
        response = send(server, agent.key, request(method))
        assert response.status_code == 404 and response.json()["error"]["code"] == -32601
    stream = httpx2.get(
        f"{server}/mcp/",
        headers={
            "Authorization": f"Bearer {agent.key}",
            "MCP-Protocol-Version": VERSION,
            "Accept": "text/event-stream",
        },
        timeout=30,
    )
    assert stream.status_code == 405 and stream.headers["allow"] == "POST"
    notice = send(server, agent.key, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert notice.status_code == 202


def test_a_held_call_is_a_task_got_and_cancelled_by_its_own_caller_only(server, agent):
    call = request("tools/call", {"name": "test__confirm", "arguments": {}}, tasks=True)
    task = send(server, agent.key, call).json()["result"]
    record = InvocationRecord.objects.get()
    assert task["resultType"] == "task" and task["taskId"] == str(record.pk)
    assert task["status"] == "working" and "approvalId" in task["statusMessage"]
    assert task["ttlMs"] is None and task["pollIntervalMs"] == 1000

    task_id = {"taskId": task["taskId"]}
    without = send(server, agent.key, request("tasks/get", task_id))
    assert without.status_code == 400 and without.json()["error"]["code"] == -32021
    assert without.json()["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    other = make_agent("acme", "agent:two")
    stolen = send(server, other.key, request("tasks/get", task_id, tasks=True))
    assert stolen.status_code == 400 and stolen.json()["error"]["code"] == -32602
    assert send(server, other.key, request("tasks/cancel", task_id, tasks=True)).status_code == 400

    got = send(server, agent.key, request("tasks/get", task_id, tasks=True)).json()["result"]
    assert got["resultType"] == "complete" and got["status"] == "working" and "result" not in got
    updated = send(
        server, agent.key, request("tasks/update", {**task_id, "inputResponses": {}}, tasks=True)
    )
    assert updated.json()["result"]["resultType"] == "complete"
    cancelled = send(server, agent.key, request("tasks/cancel", task_id, tasks=True))
    assert cancelled.status_code == 200 and cancelled.json()["result"]["resultType"] == "complete"
    got = send(server, agent.key, request("tasks/get", task_id, tasks=True)).json()["result"]
    assert got["status"] == "cancelled"
    again = send(server, agent.key, request("tasks/cancel", task_id, tasks=True))
    assert again.status_code == 200  # cancelling is cooperative: acknowledged, nothing changes
    record.refresh_from_db()
    assert record.status == Status.CANCELLED


def test_a_finished_task_carries_its_call_result_and_a_wrong_task_name_is_refused(server, agent):
    call = request("tools/call", {"name": "test__echo", "arguments": {"text": "hi"}}, tasks=True)
    done = send(server, agent.key, call).json()["result"]
    assert done["resultType"] == "complete" and done["isError"] is False  # ran at once: no task
    task_id = {"taskId": done["structuredContent"]["invocationId"]}
    got = send(server, agent.key, request("tasks/get", task_id, tasks=True)).json()["result"]
    assert got["status"] == "completed" and got["result"]["content"] == done["content"]
    wrong = send(server, agent.key, request("tasks/get", task_id, tasks=True), Mcp_Name="other")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == -32020


def test_the_traceparent_is_recorded_from_meta_or_header_and_a_malformed_one_ignored(server, agent):
    def call(text: str, headers: dict[str, str] | None = None, **meta_kw: Any) -> InvocationRecord:
        body = request("tools/call", {"name": "test__echo", "arguments": {"text": text}}, **meta_kw)
        response = send(server, agent.key, body, headers)
        assert response.status_code == 200, response.text
        return InvocationRecord.objects.get(
            pk=response.json()["result"]["structuredContent"]["invocationId"]
        )

    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    assert call("a", {"traceparent": TRACEPARENT}).traceparent == TRACEPARENT
    assert call("b", {"traceparent": TRACEPARENT}, traceparent=other).traceparent == other
    for bad in (
        "00-xyz",
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        TRACEPARENT.upper(),
        "ff" + TRACEPARENT[2:],
    ):
        assert call("c", {"traceparent": bad}).traceparent == ""


@pytest.fixture
def layered_server(transactional_db: None, settings: Any) -> Iterator[Server]:
    """Daphne and this process share a Redis channel layer, so an admin's change made here
    reaches the server's listen streams."""
    with redis_server() as url:
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "toolhub.layers.redis_layer.RedisLayer",
                "CONFIG": {"hosts": [url]},
            }
        }
        with daphne({"REDIS_URL": url}) as base:
            yield base


def test_subscriptions_listen_carries_tools_list_changed_to_the_sdk_client(layered_server, agent):
    async def scenario() -> Any:
        headers = {"Authorization": f"Bearer {agent.key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
            Client(
                streamable_http_client(f"{layered_server}/mcp/", http_client=http), mode=VERSION
            ) as c,
        ):
            before = await c.list_tools()
            async with c.listen(tools_list_changed=True, prompts_list_changed=True) as sub:
                honored = sub.honored
                await asyncio.to_thread(in_thread(lambda: _take_echo_off(agent)))
                event = await anext(aiter(sub))
            after = await c.list_tools()  # the event evicted the cached listing
            return before, honored, event, after

    before, honored, event, after = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert honored is not None and honored.tools_list_changed is True
    assert honored.prompts_list_changed is None  # toolhub has no prompts: not honored
    assert type(event).__name__ == "ToolsListChanged"
    assert "test__echo" in [t.name for t in before.tools]
    assert "test__echo" not in [t.name for t in after.tools]


def _take_echo_off(agent: Agent) -> None:
    Policy.objects.get(tenant=agent.tenant, name="allow").tools.remove(
        Tool.objects.get(pk="test__echo")
    )


def test_listen_needs_an_event_stream_and_task_ids_need_the_extension(server, agent):
    listen = request("subscriptions/listen", {"notifications": {"taskIds": ["x"]}})
    refused = send(server, agent.key, listen)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32021
    plain = request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    assert send(server, agent.key, plain, {"Accept": "application/json"}).status_code == 406


def test_a_stopping_server_ends_a_listen_stream_with_its_result(server, agent):
    listen = request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    headers = {
        "Authorization": f"Bearer {agent.key}",
        "Accept": ACCEPT,
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "subscriptions/listen",
    }
    url = f"{server}/mcp/"
    with httpx2.stream("POST", url, content=json.dumps(listen), headers=headers, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        frames = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[len("data: ") :]))
                if len(frames) == 1:  # acknowledged: now stop the server
                    os.kill(server.pid, signal.SIGTERM)
    ack, end = frames
    subscription = {"io.modelcontextprotocol/subscriptionId": 9}
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"] == {"notifications": {"toolsListChanged": True}, "_meta": subscription}
    assert end["id"] == 9 and end["result"]["resultType"] == "complete"
    assert end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 9
    assert server.process.wait(timeout=10) == 0, server.output()[-3000:]
