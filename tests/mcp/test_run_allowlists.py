"""Per-run narrowing over /mcp/: the Toolhub-Run-Tools and Toolhub-Run-Id headers, sent by
the official Python SDK's `mcp.Client` (a session of 2025-11-25, and 2026-07-28's
stateless requests) to a real Daphne."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from apps.invocations.models import InvocationRecord, Run
from tests.conftest import Agent, allow, make_agent
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

MODES = ["legacy", "2026-07-28"]
ECHO, CONFIRM = "test__echo", "test__confirm"


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne({}) as base:
        yield base


@pytest.fixture
def agent(test_tools: list[str]) -> Agent:
    agent = make_agent("acme", "agent:one")
    allow(agent.tenant, ECHO, CONFIRM)
    return agent


@asynccontextmanager
async def client(server: Server, key: str, mode: str, **headers: str) -> AsyncIterator[Client]:
    sent = {"Authorization": f"Bearer {key}", **headers}
    async with (
        httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(f"{server}/mcp/", http_client=http), mode=mode) as c,
    ):
        yield c


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def scenario(server: Server, agent: Agent, mode: str, **headers: str) -> Any:
    async def go() -> Any:
        async with client(server, agent.key, mode, **headers) as c:
            listed = await c.list_tools()
            outside = await c.call_tool(CONFIRM, {})
            inside = await c.call_tool(ECHO, {"text": "hi"})
            return [t.name for t in listed.tools], outside, inside

    return run(go())


def refusal(server: Server, agent: Agent, mode: str, tools: str) -> str:
    """The error a client gets when its Toolhub-Run-Tools header is refused."""

    async def go() -> None:
        async with client(server, agent.key, mode, **{"Toolhub-Run-Tools": tools}) as c:
            await c.list_tools()

    with pytest.raises(Exception) as refused:
        run(go())
    error: BaseException = refused.value
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(error)
    return str(error)


@pytest.mark.parametrize("mode", MODES)
def test_a_client_starting_its_run_with_tools_sees_and_calls_only_those(server, agent, mode):
    refused = refusal(server, agent, mode, f"{ECHO}, core__no_such_tool")
    assert refused == (
        "Toolhub-Run-Tools: Not in this caller's catalog (GET /api/v1/tools/ lists it): "
        "core__no_such_tool."
    )
    assert "An allowlist names at least one tool" in refusal(server, agent, mode, ",")
    assert not Run.objects.exists()

    names, outside, inside = scenario(server, agent, mode, **{"Toolhub-Run-Tools": ECHO})
    assert names == [ECHO]
    assert outside.is_error is True
    assert outside.structured_content["errorCode"] == "policy_denied"
    assert "(its allowlist)" in outside.structured_content["safeMessage"]
    assert inside.is_error is False
    runs = {r.run_id: r.tool_allowlist for r in Run.objects.all()}
    for record in InvocationRecord.objects.all():
        assert runs[record.run_id] == [ECHO]


def test_a_run_started_over_rest_narrows_the_client_that_names_it(server, agent):
    body = {"runId": "run-x", "tools": [CONFIRM]}
    assert agent.client.post("/api/v1/runs/", body, format="json").status_code == 201
    names, held, refused = scenario(server, agent, "legacy", **{"Toolhub-Run-Id": "run-x"})
    assert names == [CONFIRM]
    assert held.structured_content["status"] == "pending_approval"
    assert refused.structured_content["errorCode"] == "policy_denied"
    assert set(InvocationRecord.objects.values_list("run_id", flat=True)) == {"run-x"}
