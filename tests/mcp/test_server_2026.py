"""/mcp/ in MCP 2026-07-28 beside the older revisions, driven by the official Python SDK's
`mcp.Client` (mode "2026-07-28", "auto" and "legacy") against a real Daphne.

The SDK has no client for the Tasks extension yet; `Tasks` below is one, written on the
SDK's extension surface (a result claim for `resultType: "task"`, polling `tasks/get`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Literal

import anyio
import httpx2
import mcp_types as types
import pytest
from django.contrib.auth.models import User
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.approvals.tasks import run_approved_call
from apps.invocations.models import InvocationRecord, Status
from tests.conftest import Agent, allow, make_agent
from tests.support.server import Server, daphne
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

MODES = ["2026-07-28", "auto", "legacy"]
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


class TaskHandle(types.Result):
    result_type: Literal["task"]
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskState(types.Result):
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"  # Mcp-Name carries the task id


class Tasks(ClientExtension):
    """The Tasks extension's client side: a task handle is polled until it ends."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self) -> None:
        self.handles: list[TaskHandle] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        self.handles.append(handle)
        while True:
            request = GetTask(params=TaskParams(task_id=handle.task_id))
            state = await ctx.session.send_request(request, TaskState)
            if state.status == "completed":
                return types.CallToolResult.model_validate(state.result)
            if state.status in ("cancelled", "failed"):
                text = types.TextContent(type="text", text=state.status_message or state.status)
                return types.CallToolResult(content=[text], is_error=True)
            await anyio.sleep((state.poll_interval_ms or 1000) / 1000)


@asynccontextmanager
async def client(server: Server, key: str, mode: str, **kw: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}", "traceparent": TRACEPARENT}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(
            streamable_http_client(f"{server}/mcp/", http_client=http), mode=mode, **kw
        ) as connected,
    ):
        yield connected


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def approve_when_held() -> threading.Thread:
    """Approves the first held call as soon as it is held, as a human would, and runs it."""

    def approve() -> None:
        for _ in range(300):
            approval = ApprovalRequest.objects.first()
            if approval is not None:
                boss = User.objects.create_superuser("boss", password="pw-boss-123456")
                decisions.decide(approval.pk, boss, "approve")
                run_approved_call.call(str(approval.pk))
                return
            time.sleep(0.1)

    thread = threading.Thread(target=in_thread(approve), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", MODES)
def test_list_and_a_read_only_call_in_each_mode(server, agent, mode):
    async def scenario() -> Any:
        async with client(server, agent.key, mode) as c:
            listed = await c.list_tools()
            called = await c.call_tool("test__echo", {"text": "hello"})
            return c.protocol_version, listed, called

    version, listed, called = run(scenario())
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert sorted(t.name for t in listed.tools) == ["test__confirm", "test__echo"]
    if mode != "legacy":
        assert listed.cache_scope == "private" and listed.ttl_ms == 30_000
    assert called.is_error is False
    assert json.loads(called.content[0].text) == {"text": "hello"}
    record = InvocationRecord.objects.get()
    assert record.status == Status.SUCCEEDED and record.traceparent == TRACEPARENT


@pytest.mark.parametrize("mode", ["2026-07-28", "auto"])
def test_a_held_call_is_a_task_decided_while_the_client_waits(server, agent, mode):
    tasks = Tasks()

    async def scenario() -> Any:
        async with client(server, agent.key, mode, extensions=[tasks]) as c:
            return await c.call_tool("test__confirm", {})

    approving = approve_when_held()
    result = run(scenario())
    approving.join(10)
    record = InvocationRecord.objects.get()
    assert [h.task_id for h in tasks.handles] == [str(record.pk)]
    assert tasks.handles[0].status == "working"
    assert result.is_error is False, result
    assert result.structured_content["status"] == "succeeded"
    assert record.status == Status.SUCCEEDED and record.traceparent == TRACEPARENT


def test_a_held_call_in_legacy_mode_is_awaited_with_tasks_result_until_decided(server, agent):
    """The SDK's 2025-11-25 client validates a tools/call result as CallToolResult, so it
    cannot ask for a task; the held answer's invocationId is the task id tasks/result awaits."""

    async def scenario() -> Any:
        async with client(server, agent.key, "legacy") as c:
            held = await c.call_tool("test__confirm", {})
            wait = types.GetTaskPayloadRequestParams(
                task_id=held.structured_content["invocationId"]
            )
            decided = await c.session.send_request(
                types.GetTaskPayloadRequest(params=wait), types.CallToolResult
            )
            return held, decided

    approving = approve_when_held()
    held, decided = run(scenario())
    approving.join(10)
    assert held.structured_content["status"] == "pending_approval"
    assert decided.is_error is False
    assert decided.structured_content["status"] == "succeeded"
    assert InvocationRecord.objects.get().status == Status.SUCCEEDED


def test_without_the_tasks_extension_a_held_call_answers_at_once(server, agent):
    async def scenario() -> Any:
        async with client(server, agent.key, "2026-07-28") as c:
            return await c.call_tool("test__confirm", {})

    result = run(scenario())
    record = InvocationRecord.objects.get()
    assert record.status == Status.PENDING_APPROVAL
    assert result.is_error is False and str(record.pk) in result.content[0].text


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_and_an_unknown_tool_in_each_mode(server, agent, mode):
    async def scenario() -> Any:
        async with client(server, agent.key, mode) as c:
            bad = await c.call_tool("test__echo", {"text": 5})
            with pytest.raises(MCPError) as unknown:
                await c.call_tool("test__nothing", {})
            return bad, unknown.value

    bad, unknown = run(scenario())
    assert bad.is_error is True
    assert bad.structured_content["errorCode"] == "validation"
    assert unknown.code == -32602 and "Unknown tool" in unknown.error.message
    assert InvocationRecord.objects.get().error_code == "validation"  # only the bad call


@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_key_is_refused_in_each_mode(server, agent, mode):
    async def scenario() -> None:
        async with client(server, "th_wrong_key", mode) as c:
            await c.list_tools()

    with pytest.raises(Exception) as refused:
        run(scenario())
    assert "401" in repr(refused.value) or "Authentication" in repr(refused.value), refused.value
    assert not InvocationRecord.objects.exists()
