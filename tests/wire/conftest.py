"""Wire tests: golden fixtures, and an agent allowed the test tools (echo, a held `confirm`)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Agent, allow

FIXTURES = Path(__file__).parent / "fixtures"
CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"

# The client is its own package (`pip install ./clients/python`, which `make` does); tests
# also find it in the checkout when only toolhub itself is installed.
if str(CLIENT) not in sys.path:
    sys.path.append(str(CLIENT))
OPENAI = "/api/v1/wire/openai/tool-calls/"
ANTHROPIC = "/api/v1/wire/anthropic/tool-use/"


def fixture_names(prefix: str) -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob(f"{prefix}_*.json"))


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def assert_shape(expected: Any, actual: Any, where: str = "$") -> None:
    """Exact key sets and values, in any key order; "<str>" and "<uuid>" stand for any such
    value. A tool message's or tool_result's `content` is JSON text, compared parsed."""
    if expected == "<str>":
        assert isinstance(actual, str) and actual, where
    elif expected == "<uuid>":
        assert isinstance(actual, str), where
        uuid.UUID(actual)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r}"
        assert set(actual) == set(expected), f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        for key, value in expected.items():
            got = actual[key]
            if key == "content" and isinstance(got, str) and not isinstance(value, str):
                got = json.loads(got)
            assert_shape(value, got, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r}"
        for n, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_shape(e, a, f"{where}[{n}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.fixture
def wire_agent(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, "test__echo", "test__confirm", "test__crash", name="wire")
    return agent
