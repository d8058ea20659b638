"""Imported tools over toolhub's /mcp/, as MCP clients see them: the server's titles and
hints beside toolhub's effect, and results passed through as the server sent them
(tests/mcp/servers/shapes.py, called through toolhub with the official Python SDK client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from mcp import types

from apps.invocations.models import InvocationRecord
from tests.conftest import Agent, allow, make_agent
from tests.mcp.conftest import SERVERS, add, enable
from tests.mcp.servers.shapes import PIXEL
from tests.mcp.test_server import connected, run
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

IDS = ("mcp__shapes__snapshot", "mcp__shapes__tidy", "mcp__shapes__plain")


@pytest.fixture
def agent() -> Agent:
    add("shapes", f"python {SERVERS}/shapes.py")
    enable(*IDS)
    agent = make_agent("demo", "agent:demo")
    allow(agent.tenant, *IDS)
    return agent


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne({"TOOLHUB_MCP_STDIO_COMMANDS": "python"}) as base:
        yield base


def listed(server: Server, key: str) -> dict[str, types.Tool]:
    async def scenario() -> Any:
        async with connected(server, key) as session:
            return (await session.list_tools()).tools

    return {tool.name: tool for tool in run(scenario())}


def test_tools_list_shows_the_servers_titles_and_hints_beside_toolhubs_effect(server, agent):
    tools = listed(server, agent.key)
    snapshot = tools["mcp__shapes__snapshot"]
    assert snapshot.title == "Take a snapshot"
    assert snapshot.annotations is not None
    assert snapshot.annotations.title == "Take a snapshot"
    assert snapshot.annotations.read_only_hint is True
    assert snapshot.annotations.open_world_hint is False  # toolhub's effect would say True
    assert snapshot.annotations.destructive_hint is True  # the spec's default: not declared
    assert snapshot.annotations.idempotent_hint is False
    assert snapshot.meta is not None
    assert snapshot.meta["toolhub/effect"] == "external_side_effect"
    tidy = tools["mcp__shapes__tidy"]
    assert tidy.title == "Tidy up"  # from annotations.title
    assert tidy.annotations is not None and tidy.annotations.destructive_hint is False
    plain = tools["mcp__shapes__plain"]
    assert plain.title == "shapes__plain"  # nothing declared: toolhub's name
    assert plain.annotations is not None
    assert (plain.annotations.read_only_hint, plain.annotations.destructive_hint) == (False, True)
    assert (plain.annotations.idempotent_hint, plain.annotations.open_world_hint) == (False, True)


def test_an_imported_tools_image_and_structured_content_reach_the_client_as_sent(server, agent):
    async def scenario() -> Any:
        async with connected(server, agent.key) as session:
            return await session.call_tool("mcp__shapes__snapshot", {"label": "dot"})

    result = run(scenario())
    assert result.is_error is False
    text, image = result.content
    assert isinstance(text, types.TextContent) and text.text == "A 1x1 picture labelled dot."
    assert isinstance(image, types.ImageContent)
    assert (image.data, image.mime_type) == (PIXEL, "image/png")
    assert result.structured_content == {"width": 1, "height": 1, "label": "dot"}
    assert result.meta is not None
    invocation = result.meta["toolhub/invocation"]
    record = InvocationRecord.objects.get(pk=invocation["invocationId"])
    assert invocation["status"] == "succeeded" and record.ok
    assert "result" not in invocation


def test_an_imported_tool_without_structured_content_answers_without_it(server, agent):
    async def scenario() -> Any:
        async with connected(server, agent.key) as session:
            return await session.call_tool("mcp__shapes__plain", {})

    result = run(scenario())
    assert [block.text for block in result.content if isinstance(block, types.TextContent)] == [
        "plain"
    ]
    assert result.is_error is False
    assert result.structured_content is None
