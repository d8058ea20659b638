from __future__ import annotations

import pytest

from tests.conftest import Agent, allow


@pytest.fixture
def caller(agent: Agent, test_tools: list[str]) -> Agent:
    """`acme`'s agent:test, allowed the test tools too."""
    allow(agent.tenant, *test_tools, name="test tools")
    return agent
