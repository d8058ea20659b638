"""/readyz answers within a second whatever streams are open (its 503 during an
outage and its recovery are in test_outages.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import allow, make_agent
from tests.streams.conftest import nothing_arrives, open_ws
from tests.support.redis import redis_server
from tests.support.server import daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]


def readyz(base: str) -> tuple[int, dict[str, object], float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    return status, json.loads(body), time.monotonic() - started


def test_it_answers_readyz_at_once_while_a_stream_idles_on_the_redis_layer(test_tools):
    """The probe used to wait behind the idle stream's feed (channels-redis lets one
    receiver at a time pop this process's messages) until the next event came."""
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo")
    with redis_server() as redis_url, daphne({"REDIS_URL": redis_url}) as server:
        headers = {"Authorization": f"Bearer {agent.key}"}
        with open_ws(server, "/ws/v1/runs/run-idle/", headers) as idle:
            nothing_arrives(idle, 1)
            for _ in range(3):
                status, body, took = readyz(server)
                assert status == 200, body
                assert took < 1.0, f"/readyz took {took:.2f} s with an idle stream open"
