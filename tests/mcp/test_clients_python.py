"""toolhub's /mcp/ driven by Python MCP clients nobody here wrote (issue 41): FastMCP's
client and Pydantic AI's MCP toolset, each against a real Daphne, without a model: list the
catalog, make a read-only call, be refused with a wrong key; and a client that opens a
session per call keeps one run by naming it in `_meta.runId`.

Not here, because they do not install beside the pinned mcp 2 stack (docs/mcp.md,
"Clients"): the OpenAI Agents SDK and LangChain's MCP adapters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic_ai.mcp import MCPToolset

from apps.invocations.models import InvocationRecord, Status
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

WRONG_KEY = "th_wrong_key"


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


@pytest.fixture
def demo(test_tools: list[str]) -> Agent:
    agent = make_agent("demo", "agent:clients")
    allow(agent.tenant, *CORE_TOOLS, "test__echo")
    return agent


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def url(server: Server) -> str:
    return f"{server}/mcp/"


def clock_record(agent: Agent) -> InvocationRecord:
    record = InvocationRecord.objects.get(tenant=agent.tenant, tool_id="core__get_current_time")
    assert record.status == Status.SUCCEEDED and record.principal == agent.principal
    return record


def assert_refused(error: MCPError) -> None:
    """Both clients raise the JSON-RPC error of toolhub's 401 body."""
    assert error.code == -32600
    assert error.message == (
        "Authentication required: Authorization: Bearer <API key>. Invalid or revoked API key."
    )


# ---------------------------------------------------------------- FastMCP


def fastmcp_client(server: Server, key: str) -> FastMCPClient[Any]:
    return FastMCPClient(StreamableHttpTransport(url(server), auth=key), timeout=30)


def test_fastmcps_client_lists_and_calls(server, demo):
    async def scenario() -> Any:
        async with fastmcp_client(server, demo.key) as client:
            tools = await client.list_tools()
            result = await client.call_tool("core__get_current_time", {"timezone": "UTC"})
            return tools, result

    tools, result = run(scenario())
    assert sorted(t.name for t in tools) == sorted([*CORE_TOOLS, "test__echo"])
    assert result.is_error is False
    assert result.structured_content["result"]["timezone"] == "UTC"
    assert result.structured_content["invocationId"] == str(clock_record(demo).pk)


def test_fastmcps_client_is_refused_with_a_wrong_key(server, demo):
    async def scenario() -> None:
        async with fastmcp_client(server, WRONG_KEY) as client:
            await client.list_tools()

    with pytest.raises(MCPError) as refused:
        run(scenario())
    assert_refused(refused.value)
    assert not InvocationRecord.objects.exists()


# ---------------------------------------------------------------- Pydantic AI


def test_pydantic_ais_toolset_lists_and_calls(server, demo):
    async def scenario() -> Any:
        toolset = MCPToolset(url(server), auth=demo.key, tool_error_behavior="error")
        async with toolset:
            tools = await toolset.list_tools()
            return tools, await toolset.direct_call_tool("core__get_current_time", {})

    tools, answer = run(scenario())
    assert sorted(t.name for t in tools) == sorted([*CORE_TOOLS, "test__echo"])
    # Without an outputSchema, the toolset gives the structured content: toolhub's record.
    assert answer["invocationId"] == str(clock_record(demo).pk)
    assert answer["result"]["timezone"] == "UTC"


def test_pydantic_ais_toolset_is_refused_with_a_wrong_key(server, demo):
    async def scenario() -> None:
        toolset = MCPToolset(url(server), auth=WRONG_KEY, tool_error_behavior="error")
        async with toolset:
            await toolset.list_tools()

    with pytest.raises(MCPError) as refused:
        run(scenario())
    assert_refused(refused.value)


def test_a_client_with_a_session_per_call_keeps_one_run_by_naming_it(server, demo):
    """Pydantic AI's toolset, used outside `async with`, opens a session for each call (as
    LangChain's adapters do by default): the plan made in one call is there in the next
    only when both name the same run."""
    toolset = MCPToolset(url(server), auth=demo.key, tool_error_behavior="error")

    async def plan(meta: dict[str, Any] | None) -> Any:
        setup = {"objective": "ship", "initial_steps": ["a"]}
        await toolset.direct_call_tool("core__planning_setup_plan", setup, metadata=meta)
        return await toolset.direct_call_tool("core__planning_read_plan", {}, metadata=meta)

    named = run(plan({"runId": "run_from_pydantic_ai"}))
    assert named["runId"] == "run_from_pydantic_ai"
    assert named["result"]["objective"] == "ship"
    records = InvocationRecord.objects.filter(run_id="run_from_pydantic_ai")
    assert records.count() == 2
    assert set(records.values_list("status", flat=True)) == {Status.SUCCEEDED}

    with pytest.raises(ToolError, match="This run has no plan yet"):
        run(plan(None))
    others = InvocationRecord.objects.exclude(run_id="run_from_pydantic_ai")
    assert others.count() == 2
    assert len(set(others.values_list("run_id", flat=True))) == 2  # a run per session
