"""The scale-out deployment broken on purpose: PostgreSQL, Redis, two Daphne processes
and a worker, as docs/deployment.md sets them up, with faults injected one by one.

It runs on a PostgreSQL server of its own (tests.support.postgres), which it stops
and starts; the suite's database is never touched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.streams.conftest import KeyClient, events, nothing_arrives, open_ws, request
from tests.support.postgres import Postgres, postgres_server
from tests.support.processes import stop
from tests.support.redis import redis_server
from tests.support.server import ROOT, daphne, free_port

pytestmark = pytest.mark.server

TALLY = "test__tally"  # held for approval; writes one line per execution


@pytest.fixture(autouse=True)
def _postgresql_leg_only() -> None:
    if connection.vendor == "sqlite":
        pytest.skip(
            "the fault test restarts a PostgreSQL server of its own and runs several "
            "processes on it: it runs in the PostgreSQL leg (scripts/test)"
        )


def remote(env: dict[str, str], step: str, *args: str) -> Any:
    """A step of tests/faults/remote.py against the test's own database."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.remote", step, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def worker(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "toolhub_worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            stop(process)


def get(
    base: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any, float]:
    started = time.monotonic()
    try:
        req = urllib.request.Request(f"{base}{path}", headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, dict(error.headers), error.read()
    return status, headers, json.loads(raw), time.monotonic() - started


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def audit(pg: Postgres) -> dict[str, Any]:
    """Every record with its status, and every run's events, read straight from the database."""
    with psycopg.connect(host=str(pg.dir), user="postgres", dbname="toolhub") as db:
        runs: dict[str, list[dict[str, Any]]] = {}
        for run_id, message in db.execute(
            "SELECT run_id, message FROM invocations_runevent ORDER BY run_id, seq"
        ):
            runs.setdefault(run_id, []).append(message)
        records = [
            {"run": run_id, "call": call_id, "status": status}
            for run_id, call_id, status in db.execute(
                "SELECT run_id, tool_call_id, status FROM invocations_invocationrecord"
            )
        ]
    return {"runs": runs, "records": records}


def check_every_final_record_has_its_result(audit: dict[str, Any]) -> None:
    for run_id, stream in audit["runs"].items():
        assert [e["seq"] for e in stream] == list(range(1, len(stream) + 1)), run_id
    for record in audit["records"]:
        results = [
            e
            for e in audit["runs"].get(record["run"], [])
            if e["type"] == "tool_call_result" and e["toolCallId"] == record["call"]
        ]
        final = record["status"] in ("succeeded", "failed", "cancelled")
        assert len(results) == (1 if final else 0), (record, results)


def test_the_scale_out_deployment_survives_its_dependencies_faults(tmp_path):
    tally = tmp_path / "tally.log"
    tally.touch()
    worker_log = tmp_path / "worker.log"
    with postgres_server() as pg, ExitStack() as stack:
        redis = Redis()
        stack.callback(redis.stop)
        env = deployment_env(pg, redis.start())
        key = migrated_and_seeded(env)
        a = stack.enter_context(daphne(env))
        b = stack.enter_context(daphne(env))
        agent_a, agent_b = KeyClient(a, key), KeyClient(b, key)
        bearer = agent_a.headers

        # ---- the worker is killed mid-batch: every call runs at most once, and every
        # final record has its tool_call_result.
        held = [
            agent_a.invoke(
                TALLY,
                args={"path": str(tally), "token": f"t{n}"},
                runId=f"run-batch-{n}",
                toolCallId=f"toolu_{n}",
            )["approvalId"]
            for n in range(10)
        ]
        with worker(env, worker_log) as first:
            remote(env, "approve", *held)
            kill_after = random.randint(1, 6)
            wait_for(
                lambda: len(tally.read_text().splitlines()) >= kill_after, 30, "the batch to start"
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        ran_before_kill = len(tally.read_text().splitlines())
        second = stack.enter_context(worker(env, worker_log))

        def batch_done() -> dict[str, Any] | None:
            found = audit(pg)
            statuses = [r["status"] for r in found["records"]]
            return found if "queued" not in statuses and statuses.count("running") <= 1 else None

        settled = wait_for(batch_done, 40, "the second worker to finish the batch")
        lines = tally.read_text().splitlines()
        assert all(lines.count(f"t{n}") <= 1 for n in range(10)), lines
        assert ran_before_kill < 10 or len(lines) == 10
        check_every_final_record_has_its_result(settled)

        # ---- PostgreSQL restarts: the API says 503 with Retry-After, /readyz says 503,
        # the worker survives, and all of it works again once the database is back.
        pg.stop()
        status, headers, body, _ = get(a, "/api/v1/tools/", bearer)
        assert (status, headers.get("Retry-After")) == (503, "5"), body
        status, _, body, took = get(b, "/readyz")
        assert status == 503 and body["checks"]["database"] is False and took < 1.5, body
        time.sleep(3)  # a few of the worker's retries
        pg.start()
        wait_for(lambda: get(b, "/readyz")[0] == 200, 15, "/readyz to recover")
        assert second.poll() is None, worker_log.read_text(errors="replace")
        after = agent_a.invoke(
            TALLY, args={"path": str(tally), "token": "after-pg"}, runId="run-after-pg"
        )
        remote(env, "approve", after["approvalId"])
        wait_for(lambda: "after-pg" in tally.read_text(), 20, "the worker to run a new call")

        # ---- Redis restarts: a stream open across it completes, in order, once each.
        with open_ws(b, "/ws/v1/runs/run-redis/", bearer) as stream:
            agent_a.invoke("test__echo", args={"text": "before"}, runId="run-redis")
            assert [e["seq"] for e in events(stream, 2)] == [1, 2]
            redis.stop()
            redis.start()
            agent_a.invoke("test__echo", args={"text": "after"}, runId="run-redis")
            received = events(stream, 2, timeout=20)
            assert [e["seq"] for e in received] == [3, 4], received
            assert [e["type"] for e in received] == ["tool_call_start", "tool_call_result"]
            nothing_arrives(stream, 1)

        # ---- one Daphne dies: its streams resume on the other, each event once.
        with open_ws(a, "/ws/v1/runs/run-failover/", bearer) as stream:
            agent_b.invoke("test__echo", args={"text": "one"}, runId="run-failover")
            seen = events(stream, 2)
            os.kill(a.pid, signal.SIGKILL)
        agent_b.invoke("test__echo", args={"text": "two"}, runId="run-failover")
        with open_ws(b, f"/ws/v1/runs/run-failover/?after={seen[-1]['seq']}", bearer) as resumed:
            rest = events(resumed, 2)
            nothing_arrives(resumed, 1)
        assert [e["seq"] for e in seen + rest] == [1, 2, 3, 4]

        # ---- /readyz answers at once with idle streams open.
        with (
            open_ws(b, "/ws/v1/runs/run-idle-1/", bearer),
            open_ws(b, "/ws/v1/runs/run-idle-2/", bearer),
        ):
            status, _, body, took = get(b, "/readyz")
            assert status == 200 and took < 1.0, (body, took)

        check_every_final_record_has_its_result(audit(pg))
        assert second.poll() is None, worker_log.read_text(errors="replace")
        status, _ = request(b, "GET", "/api/v1/tools/", headers=bearer)
        assert status == 200


class Redis:
    """redis-server that can be stopped and started again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.running: AbstractContextManager[str] | None = None

    def start(self) -> str:
        self.running = redis_server(self.port)
        return self.running.__enter__()

    def stop(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            running.__exit__(None, None, None)


def deployment_env(pg: Postgres, redis_url: str) -> dict[str, str]:
    env = {
        "DATABASE_URL": pg.url,
        "REDIS_URL": redis_url,
        "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools,tests.approvals.tools",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
        "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    if not os.environ.get("TOOLHUB_ENCRYPTION_KEY"):
        from cryptography.fernet import Fernet

        env["TOOLHUB_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
    return env


def migrated_and_seeded(env: dict[str, str]) -> str:
    """Migrate the deployment's database and seed it; the seeded agent's key."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env={**os.environ, **env},
        check=True,
        timeout=120,
    )
    return str(remote(env, "seed")["key"])
