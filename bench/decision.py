"""Decision latency: from an operator's approval to the call's tool_call_result at a
subscriber of the run's stream, in both deployment modes.

    .venv/bin/python bench/decision.py [--samples 20] [--modes embedded,scale-out]
    .venv/bin/python bench/decision.py --throughput 2000 [--workers 2]

embedded: one Daphne with TOOLHUB_EMBEDDED_WORKER=1, SQLite, in-memory channel layer.
scale-out: a throwaway PostgreSQL server and redis-server, one Daphne, one
`manage.py toolhub_worker`.

Each sample holds a call of test__tally (always held for approval), opens a
WebSocket subscriber on its run, has an operator approve it through the web
process (POST /api/v1/approvals/<id>/decision/, as the console does) and measures the
receipt of tool_call_result minus the `at` of approval_decided (taken inside the
decision's transaction, just before it commits). Prints p50/p90/max and writes
bench/results/decision-<date>.json. Nothing here asserts on timings.

--throughput N: the queue's rate (issue 13: "queued calls with PostgreSQL and 2 worker
processes"). N held calls of test__confirm (a no-op, always held) are approved in bulk
through decisions.decide (the model-level decision, no HTTP), their operator
notifications are taken off the queue, then `--workers` toolhub_worker processes start
on PostgreSQL (Redis as the channel layer) and the rate is N over the time from the
first claim to the last final record. It checks that every record is final with
exactly one tool_call_result event, and every queue entry SUCCESSFUL, and reads the CPU
the workers, PostgreSQL and Redis spent over the drain (per call).

--output PATH writes the JSON there instead of bench/results/.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
# This process only drives the servers; its settings just have to load.
os.environ.setdefault("TOOLHUB_SECRET_KEY", os.urandom(32).hex())
os.environ.setdefault("TOOLHUB_VAR_DIR", tempfile.mkdtemp(prefix="toolhub-bench-driver-"))
os.environ.setdefault("TOOLHUB_ENCRYPTION_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
import django  # noqa: E402

django.setup()

from websockets.sync.client import connect  # noqa: E402

from tests.streams.conftest import Browser  # noqa: E402
from tests.support.postgres import postgres_server  # noqa: E402
from tests.support.processes import stop  # noqa: E402
from tests.support.redis import redis_server  # noqa: E402
from tests.support.server import daphne  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"


def run(env: dict[str, str], *command: str) -> str:
    done = subprocess.run(  # noqa: S603  (our own interpreter and scripts)
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{command} failed:\n{done.stderr}")
    return done.stdout


def remote(env: dict[str, str], *args: str) -> Any:
    return json.loads(run(env, "-m", "tests.faults.remote", *args).strip().splitlines()[-1])


def base_env(var_dir: Path) -> dict[str, str]:
    from cryptography.fernet import Fernet

    return {
        "TOOLHUB_VAR_DIR": str(var_dir),
        "TOOLHUB_SECRET_KEY": os.urandom(32).hex(),
        "TOOLHUB_ENCRYPTION_KEY": Fernet.generate_key().decode(),
        "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools,tests.approvals.tools",
        "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "toolhub.settings",
    }


@contextmanager
def deployment(mode: str, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = base_env(work)
    with ExitStack() as stack:
        if mode == "embedded":
            env["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
            env["TOOLHUB_EMBEDDED_WORKER"] = "1"
        else:
            env["DATABASE_URL"] = stack.enter_context(postgres_server()).url
            env["REDIS_URL"] = stack.enter_context(redis_server())
        run(env, "manage.py", "migrate", "--noinput", "-v0")
        base = stack.enter_context(daphne(env))
        if mode == "scale-out":
            with (work / "worker.log").open("wb") as log:
                worker = subprocess.Popen(
                    [sys.executable, "manage.py", "toolhub_worker"],
                    cwd=ROOT,
                    env={**os.environ, **env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            stack.callback(stop, worker)
        yield base, env


def hold(base: str, key: str, run_id: str, tally: Path) -> str:
    import urllib.request

    body = {"toolId": "test__tally", "runId": run_id, "args": {"path": str(tally), "token": run_id}}
    request = urllib.request.Request(  # noqa: S310  (http://127.0.0.1 only)
        f"{base}/api/v1/invocations/",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return str(json.loads(response.read())["approvalId"])


def sample(base: str, operator: Browser, key: str, n: int, tally: Path) -> float:
    """One held call approved by an operator through the web process, as in the console;
    the subscriber reads in a thread of its own so receipt times are taken on arrival."""
    run_id = f"run-decision-{n}"
    approval_id = hold(base, key, run_id, tally)
    url = base.replace("http://", "ws://") + f"/ws/v1/runs/{run_id}/"
    arrivals: list[tuple[dict[str, Any], float]] = []
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:

        def read() -> None:
            while not arrivals or arrivals[-1][0]["type"] != "tool_call_result":
                arrivals.append((json.loads(ws.recv(timeout=30)), time.time()))

        reader = threading.Thread(target=read)
        reader.start()
        operator.decide(approval_id, "approve", "bench")
        reader.join(timeout=35)
    at = {event["type"]: event["at"] for event, _ in arrivals}
    if os.environ.get("BENCH_DEBUG"):
        for event, received in arrivals:
            sys.stderr.write(f"{event['type']} at={event['at']} received={received:.3f}\n")
    decided = datetime.fromisoformat(at["approval_decided"].replace("Z", "+00:00"))
    return (arrivals[-1][1] - decided.timestamp()) * 1000


def prepare(count: str) -> dict[str, Any]:
    """In a process on the deployment's database: `count` held calls, all approved."""
    from django.contrib.auth.models import User
    from django_tasks_db.models import DBTaskResult

    from apps.approvals import decisions, tasks, worker
    from apps.approvals.models import ApprovalRequest
    from apps.invocations import runner
    from apps.invocations.requests import InvocationRequest
    from apps.tenants.callers import Caller
    from apps.tenants.models import ApiKey

    worker.start_push_loop()  # as a worker process does: this pushes four events per call
    key = ApiKey.objects.select_related("tenant", "user").get()
    caller = Caller.for_api_key(key)
    operator = User.objects.get(username="olga")
    for n in range(int(count)):
        record = runner.invoke(
            caller, InvocationRequest(tool_id="test__confirm", run_id=f"run-q-{n}", args={})
        )
        decisions.decide(ApprovalRequest.objects.get(invocation=record).pk, operator, "approve")
    DBTaskResult.objects.filter(task_path=tasks.notify_pending.module_path).delete()
    return {"queued": DBTaskResult.objects.filter(status="READY").count()}


def audit() -> dict[str, Any]:
    """Once the workers are done: the figures and the checks."""
    from django.db.models import Count, Max, Min
    from django_tasks_db.models import DBTaskResult

    from apps.invocations.models import InvocationRecord, RunEvent

    records = InvocationRecord.objects.filter(run_id__startswith="run-q-")
    final = records.filter(status__in=("succeeded", "failed", "cancelled"))
    per_call = (
        RunEvent.objects.filter(run_id__startswith="run-q-", type="tool_call_result")
        .values("run_id", "tool_call_id")
        .annotate(n=Count("id"))
    )
    entries = DBTaskResult.objects.all()
    span = entries.aggregate(first=Min("started_at"))
    span |= final.aggregate(last=Max("ended_at"))
    return {
        "records": records.count(),
        "final": final.count(),
        "succeeded": final.filter(status="succeeded").count(),
        "calls_with_one_result": sum(1 for row in per_call if row["n"] == 1),
        "calls_with_results": len(per_call),
        "entries_not_successful": entries.exclude(status="SUCCESSFUL").count(),
        "seconds": (span["last"] - span["first"]).total_seconds(),
    }


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (all their threads) and their reaped children."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def postgres_pids(server: Any) -> list[int]:
    """The postmaster and its children (the backends serving the workers)."""
    postmaster = int((server.dir / "data" / "postmaster.pid").read_text().split()[0])
    children = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _parent(entry) == postmaster
    ]
    return [postmaster, *children]


def redis_pids(url: str) -> list[int]:
    """The redis-server serving this URL (Redis titles itself `redis-server host:port`)."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "redis-server" in cmdline and (f":{port}" in cmdline or f"--port {port}" in cmdline):
                found.append(int(entry.name))
    return found


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def throughput(count: int, workers: int) -> dict[str, Any]:
    import psycopg

    with tempfile.TemporaryDirectory(prefix="toolhub-bench-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        env = base_env(work)
        server = stack.enter_context(postgres_server())
        env["DATABASE_URL"] = server.url
        env["REDIS_URL"] = stack.enter_context(redis_server())
        run(env, "manage.py", "migrate", "--noinput", "-v0")
        remote(env, "seed")
        remote_step(env, "prepare", str(count))
        # Progress is read with plain SQL: a Django process per poll would take a core.
        db = stack.enter_context(
            psycopg.connect(
                host=str(server.dir), user="postgres", dbname="toolhub", autocommit=True
            )
        )

        def scalar(sql: str) -> int:
            row = db.execute(sql).fetchone()
            return int(row[0]) if row else 0

        log = (work / "workers.log").open("wb")
        stack.callback(log.close)
        processes = []
        for n in range(workers):
            process = subprocess.Popen(  # noqa: S603  (our own interpreter and manage.py)
                [sys.executable, "manage.py", "toolhub_worker", "--worker-id", f"bench-{n}"],
                cwd=ROOT,
                env={**os.environ, **env, "TOOLHUB_LOG_LEVEL": "WARNING"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            stack.callback(stop, process)
            processes.append(process.pid)
        ready = "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'READY'"
        unfinished = (
            "SELECT count(*) FROM invocations_invocationrecord WHERE run_id LIKE 'run-q-%' "
            "AND status NOT IN ('succeeded', 'failed', 'cancelled')"
        )
        deadline = time.monotonic() + 600
        while scalar(ready) == count:  # the workers are still starting
            time.sleep(0.05)
        others = postgres_pids(server), redis_pids(env["REDIS_URL"])
        if not others[1]:
            raise RuntimeError("the bench's redis-server process was not found in /proc")
        cpu_before = cpu_seconds(processes), cpu_seconds(others[0]), cpu_seconds(others[1])
        while scalar(unfinished):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not finish in 10 minutes")
            time.sleep(0.2)
        others = postgres_pids(server), others[1]
        cpu_after = cpu_seconds(processes), cpu_seconds(others[0]), cpu_seconds(others[1])
        state = remote_step(env, "audit")
    state["calls_per_second"] = round(count / state["seconds"], 1)
    state["cpu_ms_per_call"] = {
        "workers": round((cpu_after[0] - cpu_before[0]) * 1000 / count, 2),
        "postgresql": round((cpu_after[1] - cpu_before[1]) * 1000 / count, 2),
        "redis": round((cpu_after[2] - cpu_before[2]) * 1000 / count, 2),
    }
    return {"mode": "throughput", "workers": workers, **state}


def remote_step(env: dict[str, str], *args: str) -> Any:
    return json.loads(run(env, str(Path(__file__)), "--step", *args).strip().splitlines()[-1])


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--modes", default="embedded,scale-out")
    parser.add_argument("--throughput", type=int, default=0, metavar="N")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", type=Path, help="where the JSON goes (default: bench/results/)")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.step:
        step, *args = options.step
        answer = prepare(*args) if step == "prepare" else audit()
        sys.stdout.write(json.dumps(answer) + "\n")
        return 0
    results = []
    if options.throughput:
        row = throughput(options.throughput, options.workers)
        sys.stdout.write(json.dumps(row) + "\n")
        RESULTS_DIR.mkdir(exist_ok=True)
        out = options.output or RESULTS_DIR / f"queue-throughput-{datetime.now(UTC):%Y-%m-%d}.json"
        out.write_text(json.dumps({"results": [row]}, indent=2) + "\n")
        sys.stdout.write(f"wrote {out}\n")
        return 0
    for mode in options.modes.split(","):
        with tempfile.TemporaryDirectory(prefix="toolhub-bench-") as tmp:
            work = Path(tmp)
            tally = work / "tally.log"
            tally.touch()
            with deployment(mode, work) as (base, env):
                key = remote(env, "seed")["key"]
                hold(base, key, "warm-up", tally)  # first request pays imports
                operator = Browser(base).login("olga", "pw-olga-12345")
                latencies = [sample(base, operator, key, n, tally) for n in range(options.samples)]
        row = {
            "mode": mode,
            "samples": len(latencies),
            "p50_ms": round(percentile(latencies, 50), 1),
            "p90_ms": round(percentile(latencies, 90), 1),
            "max_ms": round(max(latencies), 1),
        }
        results.append(row)
        sys.stdout.write(json.dumps(row) + "\n")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = options.output or RESULTS_DIR / f"decision-{datetime.now(UTC):%Y-%m-%d}.json"
    out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
