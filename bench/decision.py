"""Decision latency: from an operator's approval to the call's tool_call_result at a
subscriber of the run's stream, in both deployment modes.

    .venv/bin/python bench/decision.py [--samples 20] [--modes embedded,scale-out]

embedded: one Daphne with TOOLHUB_EMBEDDED_WORKER=1, SQLite, in-memory channel layer.
scale-out: a throwaway PostgreSQL server and redis-server, one Daphne, one
`manage.py toolhub_worker`.

Each sample holds a call of test__tally (always held for approval), opens a
WebSocket subscriber on its run, has an operator approve it through the web
process (POST /api/v1/approvals/<id>/decision/, as the console does) and measures the
receipt of tool_call_result minus the `at` of approval_decided (taken inside the
decision's transaction, just before it commits). Prints p50/p90/max and writes
bench/results/decision-<date>.json. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import base64
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


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--modes", default="embedded,scale-out")
    options = parser.parse_args()
    results = []
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
    out = RESULTS_DIR / f"decision-{datetime.now(UTC):%Y-%m-%d}.json"
    out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
