"""toolhub as an MCP server, driven by the official Python SDK's client against a real Daphne."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx2
import pytest
from guardian.shortcuts import assign_perm
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord, Status
from apps.policies.models import Policy
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.support.redis import redis_server
from tests.support.server import Server, daphne
from tests.support.threads import in_thread

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]

PAGE_SIZE = 3


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def server(transactional_db: None, redis_url: str, settings: Any) -> Iterator[Server]:
    """Daphne and this test process share a Redis channel layer, so a change made here
    reaches the server's streams as an admin's change in any process would."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "toolhub.layers.redis_layer.RedisLayer",
            "CONFIG": {"hosts": [redis_url]},
        }
    }
    env = {"REDIS_URL": redis_url, "TOOLHUB_MCP_PAGE_SIZE": str(PAGE_SIZE)}
    with daphne(env) as base:
        yield base


@pytest.fixture
def demo(test_tools: list[str]) -> Agent:
    agent = make_agent("demo", "agent:demo")
    allow(agent.tenant, *CORE_TOOLS, "test__echo", "test__confirm")
    return agent


@asynccontextmanager
async def connected(
    server: Server, key: str, messages: list[Any] | None = None
) -> AsyncIterator[ClientSession]:
    async def on_message(message: Any) -> None:
        if messages is not None:
            messages.append(message)

    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        streamable_http_client(f"{server}/mcp/", http_client=http) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        await session.initialize()
        yield session


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


async def all_tools(session: ClientSession) -> tuple[list[types.Tool], int]:
    tools: list[types.Tool] = []
    pages, cursor = 0, None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return tools, pages


def test_it_initializes_and_lists_the_callers_catalog_in_pages(server, demo):
    async def scenario() -> Any:
        async with connected(server, demo.key) as session:
            assert session.server_info is not None and session.server_info.name == "toolhub"
            caps = session.server_capabilities
            assert caps is not None and caps.tools is not None and caps.tools.list_changed
            await session.send_ping()
            return await all_tools(session)

    tools, pages = run(scenario())
    names = [t.name for t in tools]
    assert names == sorted([*CORE_TOOLS, "test__echo", "test__confirm"])
    assert pages == -(-len(names) // PAGE_SIZE)
    by_name = {t.name: t for t in tools}
    clock = by_name["core__get_current_time"]
    assert clock.annotations is not None
    assert clock.annotations.read_only_hint is True
    assert clock.annotations.destructive_hint is False
    confirm = by_name["test__confirm"].annotations
    assert confirm is not None and confirm.read_only_hint is False and confirm.open_world_hint


def test_it_runs_a_call_through_the_runner_in_the_sessions_run(server, demo):
    async def scenario() -> Any:
        async with connected(server, demo.key) as session:
            first = await session.call_tool("test__echo", {"text": "hello"})
            second = await session.call_tool(
                "test__echo", {"text": "again"}, meta=cast(Any, {"runId": "run_named_by_client"})
            )
            third = await session.call_tool("test__echo", {"text": "third"})
            return first, second, third

    first, second, third = run(scenario())
    assert first.is_error is False and second.is_error is False and third.is_error is False
    assert json.loads(first.content[0].text) == {"text": "hello"}
    assert first.structured_content["status"] == "succeeded"
    records = InvocationRecord.objects.filter(tenant=demo.tenant).order_by("created_at")
    assert [r.status for r in records] == [Status.SUCCEEDED] * 3
    assert records[1].run_id == "run_named_by_client"
    assert records[0].run_id == records[2].run_id != "run_named_by_client"
    assert records[0].run_id == first.structured_content["runId"]


def test_a_held_call_answers_with_its_approval_and_invocation_ids(server, demo):
    async def scenario() -> Any:
        async with connected(server, demo.key) as session:
            return await session.call_tool("test__confirm", {})

    result = run(scenario())
    approval = ApprovalRequest.objects.get()
    record = InvocationRecord.objects.get()
    assert result.is_error is False
    assert record.status == Status.PENDING_APPROVAL
    text = result.content[0].text
    assert str(approval.pk) in text and str(record.pk) in text
    assert result.structured_content["approvalId"] == str(approval.pk)
    assert result.structured_content["invocationId"] == str(record.pk)


def test_a_denied_call_is_a_tool_error_with_policy_denied(server, demo):
    assign_perm("tools.execute_tool", agents_group(demo.tenant), Tool.objects.get(pk="test__sleep"))

    async def scenario() -> Any:
        async with connected(server, demo.key) as session:
            return await session.call_tool("test__sleep", {"ms": 1})

    result = run(scenario())
    assert result.is_error is True
    assert result.content[0].text.startswith("policy_denied: ")
    assert result.structured_content["errorCode"] == "policy_denied"
    assert InvocationRecord.objects.get().error_code == "policy_denied"


def test_a_call_with_bad_arguments_is_a_validation_error_naming_the_field(server, demo):
    async def scenario() -> Any:
        async with connected(server, demo.key) as session:
            return await session.call_tool("test__echo", {"text": 42})

    result = run(scenario())
    assert result.is_error is True
    assert result.structured_content["errorCode"] == "validation"
    assert "text" in result.content[0].text


def test_another_tenants_catalog_is_not_visible(server, demo):
    other = make_agent("globex", "agent:other")
    allow(other.tenant, "core__get_current_time")

    async def scenario() -> Any:
        async with connected(server, other.key) as session:
            listed, _ = await all_tools(session)
            called = await session.call_tool("test__echo", {"text": "hi"})
            return listed, called

    listed, called = run(scenario())
    assert [t.name for t in listed] == ["core__get_current_time"]
    assert called.is_error and called.structured_content["errorCode"] == "policy_denied"


def test_an_admin_change_sends_tools_list_changed_to_open_streams(server, demo):
    messages: list[Any] = []

    async def scenario() -> Any:
        async with connected(server, demo.key, messages) as session:
            before, _ = await all_tools(session)
            await asyncio.sleep(1)  # the GET stream is open and subscribed
            await asyncio.to_thread(in_thread(lambda: _disable_echo(demo)))
            for _ in range(100):
                if any(isinstance(m, types.ToolListChangedNotification) for m in messages):
                    break
                await asyncio.sleep(0.1)
            after, _ = await all_tools(session)
            return before, after

    before, after = run(scenario())
    assert any(isinstance(m, types.ToolListChangedNotification) for m in messages)
    assert "test__echo" in [t.name for t in before]
    assert "test__echo" not in [t.name for t in after]


def _disable_echo(agent: Agent) -> None:
    """What an admin does on the policy's page: take a tool off the policy."""
    policy = Policy.objects.get(tenant=agent.tenant, name="allow")
    policy.tools.remove(Tool.objects.get(pk="test__echo"))


def test_another_tenants_change_is_not_announced_on_this_tenants_stream(server, demo):
    other = make_agent("globex", "agent:other")
    allow(other.tenant, "core__get_current_time", "test__echo")
    messages: list[Any] = []

    def changed() -> int:
        return sum(isinstance(m, types.ToolListChangedNotification) for m in messages)

    async def scenario() -> None:
        async with connected(server, demo.key, messages):
            await asyncio.sleep(1)  # the GET stream is open and subscribed
            await asyncio.to_thread(in_thread(lambda: _disable_echo(other)))
            await asyncio.sleep(1.5)
            assert changed() == 0
            await asyncio.to_thread(in_thread(lambda: _disable_echo(demo)))
            for _ in range(100):
                if changed():
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)

    run(scenario())
    assert changed() == 1


@pytest.mark.parametrize("key", [None, "th_wrong_key"])
def test_the_sdk_client_is_refused_without_a_valid_key(server, demo, key):
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}

    async def scenario() -> BaseException | None:
        try:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=10) as http,
                streamable_http_client(f"{server}/mcp/", http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
        except BaseException as exc:  # anyio wraps it in an exception group
            return exc
        return None

    refused = run(scenario())
    assert refused is not None
    assert "Authentication required" in repr(refused), repr(refused)
