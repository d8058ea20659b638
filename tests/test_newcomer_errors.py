"""Issue 46: the refusals a newcomer meets say what is wrong and where to look, and
core__http_request can be used over /mcp/ (its connection in params._meta)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from apps.invocations.models import InvocationRecord
from apps.tools.models import Source, Tool
from tests.conftest import Agent, allow, make_agent
from tests.connections import HTTP, make_connection, usable
from tests.support.responses import failure
from tests.support.server import Server, daphne

pytestmark = pytest.mark.django_db(transaction=True)

OUTSIDE = "http://elsewhere.example.net/"  # not an allowed host: refused before any traffic
PAST_THE_CONNECTION = "does not allow requests to 'elsewhere.example.net'"


def imported_tool(tool_id: str, *, enabled: bool, available: bool) -> Tool:
    """A catalog row no source provides (its MCP import gone or unusable)."""
    return Tool.objects.create(
        id=tool_id,
        name=tool_id.split("__")[-1],
        description="An imported tool.",
        input_schema={"type": "object"},
        schema_hash="0" * 16,
        effect="read_only",
        consequence_level="low",
        source=Source.MCP,
        enabled=enabled,
        available=available,
    )


def test_an_unknown_tool_points_to_the_catalog(agent):
    code, message = failure(agent.invoke("core__no_such_tool", args={}))
    assert code == "unavailable"
    assert message == (
        "There is no tool 'core__no_such_tool'. "
        "GET /api/v1/tools/ lists the tools this caller may use."
    )


def test_a_disabled_tool_no_source_provides_is_reported_disabled(agent):
    imported_tool("mcp__old__lookup", enabled=False, available=True)
    allow(agent.tenant, "mcp__old__lookup")
    code, message = failure(agent.invoke("mcp__old__lookup", args={}))
    assert (code, message) == ("unavailable", "The tool mcp__old__lookup is disabled.")


def test_an_enabled_tool_no_longer_provided_says_so(agent):
    imported_tool("mcp__old__fetch", enabled=True, available=False)
    code, message = failure(agent.invoke("mcp__old__fetch", args={}))
    assert code == "unavailable"
    assert message == (
        "The tool mcp__old__fetch is not provided now: its code or MCP server does not offer it."
    )


# ---------------------------------------------------------------- over /mcp/


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


@pytest.fixture
def http_agent(transactional_db: None) -> Agent:
    agent = make_agent("acme", "agent:test")
    allow(agent.tenant, HTTP, name="http")
    return agent


def call_over_mcp(server: Server, key: str, meta: dict[str, Any] | None, tool: str = HTTP) -> Any:
    async def scenario() -> Any:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
            streamable_http_client(f"{server}/mcp/", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool(tool, {"url": OUTSIDE}, meta=cast(Any, meta))

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


@pytest.mark.server
def test_over_mcp_the_connection_goes_in_meta(server, http_agent):
    connection = usable(make_connection(http_agent.tenant))
    result = call_over_mcp(server, http_agent.key, {"toolhub/connectionId": str(connection.pk)})
    assert result.is_error is True
    # Through grant ∩ request, stopped later by the connection's host allowlist.
    assert PAST_THE_CONNECTION in text_of(result)
    record = InvocationRecord.objects.get(tenant=http_agent.tenant, tool_id=HTTP)
    assert record.error_code == "execution"


@pytest.mark.server
def test_over_mcp_a_missing_connection_names_the_endpoint_and_the_meta_key(server, http_agent):
    usable(make_connection(http_agent.tenant))
    result = call_over_mcp(server, http_agent.key, None)
    assert result.is_error is True
    text = text_of(result)
    assert f"{HTTP} needs a connection; none was given." in text
    assert "GET /api/v1/connections/" in text and 'params._meta["toolhub/connectionId"]' in text


@pytest.mark.server
def test_over_mcp_a_disabled_tool_no_source_provides_is_disabled_not_unknown(server, agent):
    imported_tool("mcp__old__lookup", enabled=False, available=True)
    allow(agent.tenant, "mcp__old__lookup")
    result = call_over_mcp(server, agent.key, None, tool="mcp__old__lookup")
    assert result.is_error is True
    assert text_of(result) == "unavailable: The tool mcp__old__lookup is disabled."
