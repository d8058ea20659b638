"""Fixtures for the approval tests: the test tools (and test__tally), a caller whose
test tools are allowed, and an operator who may decide their calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.approvals import tools as approval_tools
from tests.approvals.support import TEST_TOOLS, Tally, make_operator
from tests.conftest import Agent, allow


@pytest.fixture
def tools(test_tools: list[str]) -> Iterator[list[str]]:
    """tests/support/tools.py's tools plus test__tally, registered and in the catalog."""
    ids = []
    for contract in approval_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
        ids.append(contract.id)
    Tool.objects.sync_registry(registry)
    yield [*test_tools, *ids]
    for tool_id in ids:
        registry.unregister(tool_id)


@pytest.fixture
def caller(agent: Agent, tools: list[str]) -> Agent:
    """`acme`'s agent:test, allowed the test tools (confirm and tally always wait)."""
    allow(agent.tenant, *TEST_TOOLS, name="test tools")
    return agent


@pytest.fixture
def other(stranger: Agent, tools: list[str]) -> Agent:
    """`globex`'s agent, allowed the same test tools."""
    allow(stranger.tenant, *TEST_TOOLS, name="test tools")
    return stranger


@pytest.fixture
def operator(caller: Agent) -> User:
    """Staff member of `acme` with decide_approval on the test tools."""
    return make_operator("oscar", caller.tenant)


@pytest.fixture
def tally(tmp_path) -> Tally:
    return Tally(tmp_path / "tally.log")
