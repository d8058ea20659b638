"""Scale-out: two Daphne processes and a task worker sharing PostgreSQL and Redis.

A stream opened on one web process receives what another web process and a
separate worker process emit, through the Redis channel layer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import allow, make_agent
from tests.streams.conftest import (
    KeyClient,
    events,
    logged_in,
    nothing_arrives,
    open_ws,
    operator,
    request,
)
from tests.support.processes import stop
from tests.support.redis import redis_server
from tests.support.server import ROOT, daphne, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]


@pytest.fixture(autouse=True)
def _postgresql_only(db: None) -> None:
    if connection.vendor == "sqlite":
        pytest.skip(
            "scale-out needs a database several processes write at once: run on PostgreSQL "
            "(scripts/test, or scripts/test --with-postgres .venv/bin/pytest tests/streams)"
        )


def shared_env(redis_url: str) -> dict[str, str]:
    """What every process of the deployment shares: database, Redis, keys, tool modules."""
    env = {
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
    }
    if not os.environ.get("TOOLHUB_ENCRYPTION_KEY"):
        from cryptography.fernet import Fernet

        env["TOOLHUB_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
    return env


@contextmanager
def worker(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """`manage.py toolhub_worker` as its own process; stopped (and reaped) afterwards."""
    fd, name = tempfile.mkstemp(prefix="toolhub-worker-", suffix=".log")
    os.close(fd)
    log = Path(name)
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "toolhub_worker", "--interval", "0.2"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
        assert process.poll() is None, (
            f"the worker exited with {process.returncode}:\n{log.read_text(errors='replace')}"
        )
    finally:
        stop(process, timeout=15)
        log.unlink(missing_ok=True)


def test_a_stream_on_one_process_receives_what_another_process_and_the_worker_emit(
    test_tools,
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__confirm")
    olga = operator("olga", agent.tenant, decide=("test__confirm",))

    with redis_server() as redis_url:
        env = shared_env(redis_url)
        with daphne(env) as a, daphne(env) as b:
            watcher = logged_in(b, olga)
            with (
                open_ws(
                    b, "/ws/v1/runs/run-scale/", {"Authorization": f"Bearer {agent.key}"}
                ) as run,
                open_ws(b, "/ws/v1/approvals/", watcher.ws_headers) as approvals,
            ):
                # Idle past redis-py's old 5 s socket timeout first: streams on the
                # Redis layer must survive quiet periods.
                nothing_arrives(run, 7)
                # The agent's call is held by web process A...
                held = KeyClient(a, agent.key).invoke(
                    "test__confirm", args={}, runId="run-scale", toolCallId="toolu_scale"
                )
                assert held["status"] == "pending_approval", held
                [required] = events(run, 1)
                assert events(approvals, 1) == [required]

                # ... approved by an operator through A (session + CSRF) ...
                decided_body = logged_in(a, olga).decide(held["approvalId"], "approve", "ok")
                assert decided_body["status"] == "approved", decided_body
                [decided] = events(run, 1)
                assert events(approvals, 1) == [decided]
                nothing_arrives(run)  # no worker yet: nothing runs

                # ... and executed by a separate worker process.
                with worker(env):
                    start, result = events(run, 2, timeout=30)
                    nothing_arrives(approvals, 0.3)

            status, record = request(
                a,
                "GET",
                f"/api/v1/invocations/{held['invocationId']}/",
                headers={"Authorization": f"Bearer {agent.key}"},
            )

    assert [e["type"] for e in (required, decided, start, result)] == [
        "approval_required",
        "approval_decided",
        "tool_call_start",
        "tool_call_result",
    ]
    assert [e["seq"] for e in (required, decided, start, result)] == [1, 2, 3, 4]
    for event in (required, decided, start, result):
        assert event["runId"] == "run-scale"
        assert event["toolCallId"] == "toolu_scale"
        assert event["toolId"] == "test__confirm"
    assert required["approvalId"] == decided["approvalId"] == held["approvalId"]
    assert decided["decision"] == "approve" and decided["decidedBy"] == "olga"
    assert result["ok"] is True and result["result"] == {"waited": 0}
    assert status == 200 and record["status"] == "succeeded", record
