"""PostgreSQL's connection pool (toolhub/db/postgresql/) under load and faults: connections
are reused, an exhausted pool answers 503 after its timeout, slow calls do not pin a
connection each, and a restart or an outage fails no request beyond the outage itself."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import allow, make_agent
from tests.faults import pool_tools
from tests.faults.test_outages import deployment_env, migrated_and_seeded
from tests.support.postgres import Postgres, postgres_server
from tests.support.server import daphne
from tests.support.tools import CONTRACTS as SUPPORT_TOOLS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]

TOOL_MODULES = "tests.support.tools,tests.faults.pool_tools"


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's: this runs in the PostgreSQL leg (scripts/test)")


@pytest.fixture
def agent_key() -> Iterator[str]:
    """An agent allowed the pool tools, test__counted_wait and the tools list."""
    added = [c for c in [*SUPPORT_TOOLS, *pool_tools.CONTRACTS] if registry.get(c.id) is None]
    for contract in added:
        registry.register(contract)
    Tool.objects.sync_registry(registry)
    agent = make_agent("acme")
    allow(agent.tenant, pool_tools.HOLD, "test__counted_wait", "test__echo")
    yield agent.key
    for contract in added:
        registry.unregister(contract.id)
    Tool.objects.sync_registry(registry)


def call(
    base: str, method: str, path: str, key: str | None = None, body: Any = None
) -> tuple[int, dict[str, str], Any, float]:
    started = time.monotonic()
    request = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {key}"} if key else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, dict(error.headers), error.read()
    return status, headers, json.loads(raw), time.monotonic() - started


def sessions() -> int:
    """Connections PostgreSQL has accepted to this database so far (each one a fork)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def sessions_for(server: str, key: str, requests: int) -> int:
    call(server, "GET", "/api/v1/tools/", key)  # the process's first request warms it up
    time.sleep(0.5)
    before = sessions()
    for _ in range(requests):
        status, _, body, _ = call(server, "GET", "/api/v1/tools/", key)
        assert status == 200, body
    time.sleep(0.5)  # a closed backend reports its session as it exits
    return sessions() - before


def test_it_serves_sequential_requests_on_the_same_few_connections(agent_key):
    """The observable: PostgreSQL's own count of accepted connections. Without the pool
    (the contrast run) each request is a new connection, a forked backend."""
    with daphne({"TOOLHUB_EXTRA_TOOL_MODULES": TOOL_MODULES}) as pooled:
        assert sessions_for(pooled, agent_key, 50) <= 2
    with daphne({"TOOLHUB_EXTRA_TOOL_MODULES": TOOL_MODULES, "TOOLHUB_DB_POOL": "0"}) as per_call:
        assert sessions_for(per_call, agent_key, 50) >= 50


def test_an_exhausted_pool_answers_503_after_its_timeout_then_recovers(agent_key):
    env = {
        "TOOLHUB_EXTRA_TOOL_MODULES": TOOL_MODULES,
        "TOOLHUB_DB_POOL_MIN_SIZE": "1",
        "TOOLHUB_DB_POOL_MAX_SIZE": "1",
        "TOOLHUB_DB_POOL_TIMEOUT": "1",
    }
    with daphne(env) as server:
        held: list[Any] = []
        body = {"toolId": pool_tools.HOLD, "args": {"seconds": 4}}
        holder = threading.Thread(
            target=lambda: held.append(
                call(server, "POST", "/api/v1/invocations/", agent_key, body)
            )
        )
        holder.start()
        held_until = time.monotonic() + 4
        time.sleep(1)  # the tool has taken the pool's only connection
        status, headers, body, took = call(server, "GET", "/api/v1/tools/", agent_key)
        assert (status, headers.get("Retry-After")) == (503, "5"), body
        assert "database connections are in use" in body["detail"], body
        assert body["retryAfterSeconds"] == 5
        assert 0.9 <= took < 3, f"answered after {took:.2f} s with a 1 s pool timeout"
        # The holding call's own cancellation polls found no connection either: they
        # are skipped (runner._cancel_requested), and the call returns its result.
        holder.join(timeout=20)
        assert held and held[0][0] == 200 and held[0][2]["status"] == "succeeded", held
        time.sleep(max(0.0, held_until + 0.5 - time.monotonic()))
        status, _, body, _ = call(server, "GET", "/api/v1/tools/", agent_key)
        assert status == 200, body
        log = server.output()
    assert log.count("no pooled database connection came free in time") == 1, log
    assert "Traceback" not in log and "Internal Server Error" not in log, log


def test_slow_calls_do_not_hold_a_pooled_connection_each(agent_key, tmp_path):
    """12 calls of 1.5 s at once on a pool of 2: each request gives its connection back
    while its tool runs (runner._release_connection), so none waits the pool's 2 s."""
    env = {
        "TOOLHUB_EXTRA_TOOL_MODULES": TOOL_MODULES,
        "TOOLHUB_DB_POOL_MIN_SIZE": "2",
        "TOOLHUB_DB_POOL_MAX_SIZE": "2",
        "TOOLHUB_DB_POOL_TIMEOUT": "2",
    }
    trace = tmp_path / "trace.log"
    with daphne(env) as server:
        call(server, "GET", "/api/v1/tools/", agent_key)
        started = time.monotonic()

        def slow(n: int) -> tuple[int, dict[str, str], Any, float]:
            args = {"path": str(trace), "token": f"t{n}", "ms": 1500}
            body = {"toolId": "test__counted_wait", "args": args}
            return call(server, "POST", "/api/v1/invocations/", agent_key, body)

        with ThreadPoolExecutor(12) as threads:
            answers = list(threads.map(slow, range(12)))
        took = time.monotonic() - started
    assert [(a[0], a[2].get("status")) for a in answers] == [(200, "succeeded")] * 12, answers
    assert took < 6, f"12 concurrent 1.5 s calls took {took:.1f} s"


def test_a_restart_and_an_outage_fail_no_request_beyond_the_outage():
    with postgres_server() as pg, daphne_on(pg) as (server, key):
        for _ in range(5):
            assert call(server, "GET", "/api/v1/tools/", key)[0] == 200
        # A restart with no request meanwhile: every pooled connection is broken, and
        # none of them is handed out (toolhub/db/postgresql/pool.check).
        pg.stop()
        pg.start()
        for _ in range(5):
            status, _, body, _ = call(server, "GET", "/api/v1/tools/", key)
            assert status == 200, body
        # An outage: every request fails at once with a 503, the first too (it finds a
        # broken idle connection, and the check's direct connection is refused: it used
        # to wait the pool's 5 s timeout), /readyz says so within a second.
        pg.stop()
        outage = [call(server, "GET", "/api/v1/tools/", key) for _ in range(4)]
        assert [(a[0], a[1].get("Retry-After")) for a in outage] == [(503, "5")] * 4, outage
        assert all("not answering" in a[2]["detail"] for a in outage), outage
        assert max(a[3] for a in outage) < 1.0, [round(a[3], 2) for a in outage]
        status, _, body, took = call(server, "GET", "/readyz")
        assert status == 503 and body["checks"]["database"] is False and took < 1.5, body
        time.sleep(3)  # the pool's own attempts to connect fail and back off meanwhile
        pg.start()
        back = time.monotonic()
        while call(server, "GET", "/api/v1/tools/", key)[0] != 200:
            assert time.monotonic() - back < 5, "the pool did not recover within 5 s"
            time.sleep(0.1)
        after = [call(server, "GET", "/api/v1/tools/", key) for _ in range(20)]
        assert [a[0] for a in after] == [200] * 20, after
        # /readyz answers from its own checks (their own connection, about every second):
        # it follows within a few seconds, not with the pool's first success.
        ready_by = time.monotonic() + 5
        while call(server, "GET", "/readyz")[0] != 200:
            assert time.monotonic() < ready_by, "/readyz did not recover within 5 s"
            time.sleep(0.1)
        log = server.output()
    assert "Traceback" not in log and "Internal Server Error" not in log, log


@contextmanager
def daphne_on(pg: Postgres) -> Iterator[tuple[str, str]]:
    """Daphne on a PostgreSQL server of the test's own (migrated and seeded), which the
    test stops and starts; yields (base URL, agent key)."""
    env = {**deployment_env(pg, ""), "TOOLHUB_DB_POOL_MIN_SIZE": "3"}
    key = migrated_and_seeded(env)
    with daphne(env) as server:
        yield server, key
