"""/readyz answers within a second whatever streams are open, tells the truth under
full load, and says 503 when Redis stops (its 503 during a PostgreSQL outage and its
recovery are in test_outages.py and test_pool.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import allow, make_agent
from tests.faults.test_outages import Redis
from tests.streams.conftest import nothing_arrives, open_ws
from tests.support.redis import redis_server
from tests.support.server import daphne, invoke

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


LOAD_S = 4.0
LOADERS = 8


def test_readyz_polled_under_full_load_never_reports_a_dependency_down(test_tools):
    """Eight clients keep the process busy (tools that compute 150 ms on the request's
    thread, and calls whose events go through Redis) while /readyz is polled every
    100 ms: no answer may say a dependency is down, since none is. Then Redis stops, and
    /readyz says so."""
    agent = make_agent("acme")
    allow(agent.tenant, "test__inline_overrun", "test__echo")
    redis = Redis()
    try:
        with daphne({"REDIS_URL": redis.start()}) as server:
            stop = threading.Event()

            def load(n: int) -> int:
                calls = 0
                while not stop.is_set():
                    tool = "test__inline_overrun" if calls % 2 else "test__echo"
                    args = {} if calls % 2 else {"text": "x"}
                    body = {"toolId": tool, "args": args, "runId": f"run-load-{n}"}
                    invoke(server, agent.key, body, timeout=30)
                    calls += 1
                return calls

            answers = []
            with ThreadPoolExecutor(LOADERS) as pool:
                loaders = [pool.submit(load, n) for n in range(LOADERS)]
                until = time.monotonic() + LOAD_S
                while time.monotonic() < until:
                    status, body, _ = readyz(server)
                    answers.append((status, body))
                    time.sleep(0.1)
                stop.set()
                calls = sum(loader.result() for loader in loaders)
            wrong = [a for a in answers if a != (200, READY)]
            assert wrong == [], f"{len(wrong)} of {len(answers)} probes wrong: {wrong[:5]}"
            assert calls >= LOADERS and len(answers) >= 5, (calls, len(answers))

            redis.stop()
            deadline = time.monotonic() + 10
            while (answer := readyz(server)[:2]) != (503, REDIS_DOWN):
                assert time.monotonic() < deadline, f"/readyz with Redis down: {answer}"
                time.sleep(0.1)
    finally:
        redis.stop()


READY = {"status": "ok", "checks": {"database": True, "channelLayer": True}}
REDIS_DOWN = {"status": "unavailable", "checks": {"database": True, "channelLayer": False}}
