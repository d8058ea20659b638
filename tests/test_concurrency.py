"""Slow tools must not queue behind one another under the real ASGI server."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import allow, make_agent
from tests.support.server import daphne
from tests.support.tools import BARRIER_PARTIES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]


def _invoke(base: str, key: str, tool_id: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"{base}/api/v1/invocations/",
        data=json.dumps({"toolId": tool_id}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_five_concurrent_calls_are_all_inside_their_tool_at_once(test_tools):
    """test__barrier returns only when five calls wait in it together.

    If requests were served one after another, the first would wait alone until
    the barrier's 10 s timeout and fail; every call succeeding proves overlap.
    """
    agent = make_agent("acme")
    allow(agent.tenant, "test__barrier")
    with daphne() as base, ThreadPoolExecutor(BARRIER_PARTIES) as pool:
        results = list(
            pool.map(lambda _: _invoke(base, agent.key, "test__barrier"), range(BARRIER_PARTIES))
        )
    assert [r["ok"] for r in results] == [True] * BARRIER_PARTIES, results
    assert sorted(r["result"]["waited"] for r in results) == list(range(BARRIER_PARTIES))
