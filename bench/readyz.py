"""`/readyz` under load (issue 47): how long a probe waits while the process is busy.

    .venv/bin/python bench/readyz.py [--levels 0,8,16] [--seconds 15]

Starts a throwaway Redis and one Daphne on a fresh SQLite database (the scale-out layer,
`REDIS_URL`, and the test suite's tools, `tests.support.tools`). At each level, that many
load clients call in a loop, alternating a tool that computes for 150 ms on the request's
thread (`test__inline_overrun`) and an echo call whose events go through Redis
(`test__echo`), while one prober asks `/readyz` every 100 ms on a new connection, as a
load balancer does. Measured per level: probes, answers other than 200 with both
dependencies up (none is down: any such answer is wrong), the answer time's p50 and p99,
the calls the load made, and the 1-minute load average.

Prints a table and writes bench/results/readyz-<date>-redis.json (`--output`). Nothing
here asserts on timings. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fanout import (
    ROOT,
    BenchError,
    base_env,
    code_version,
    daphne,
    invoke,
    load_average,
    machine,
    next_result,
    percentile,
    prepare_state,
    redis_server,
)

GOAL_MS = 200.0
READY = {"status": "ok", "checks": {"database": True, "channelLayer": True}}
LOAD_TOOLS = ("test__inline_overrun", "test__echo")

# Runs in `manage.py shell -c` after prepare_state: the bench tenant may call the load's
# tools (as tests/conftest.py's allow()).
GRANT_CODE = f"""
from guardian.shortcuts import assign_perm
from apps.policies.models import Policy
from apps.tenants.models import Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool

tenant = Tenant.objects.get(slug="bench")
policy = Policy.objects.get(tenant=tenant, name="bench")
for tool in Tool.objects.filter(pk__in={list(LOAD_TOOLS)!r}):
    policy.tools.add(tool)
    assign_perm("tools.execute_tool", agents_group(tenant), tool)
print("GRANTED", Tool.objects.filter(pk__in={list(LOAD_TOOLS)!r}).count())
"""

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(base: str) -> tuple[int, Any, float]:
    started = time.monotonic()
    try:
        with _opener.open(f"{base}/readyz", timeout=10) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    took = (time.monotonic() - started) * 1000
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = body.decode(errors="replace")[:200]
    return status, parsed, took


def level(base: str, key: str, loaders: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    failures: list[Any] = []

    def load(n: int) -> int:
        calls = 0
        while not stop.is_set():
            tool = LOAD_TOOLS[calls % 2]
            args = {"text": "x"} if tool == "test__echo" else {}
            status, body = invoke(base, key, {"toolId": tool, "args": args, "runId": f"load-{n}"})
            if status >= 500 or status in (401, 403, 404):
                failures.append((status, body))
                return calls
            calls += 1
        return calls

    times: list[float] = []
    wrong: list[Any] = []
    with ThreadPoolExecutor(max(1, loaders)) as pool:
        workers = [pool.submit(load, n) for n in range(loaders)]
        time.sleep(1.0 if loaders else 0)  # the load under way
        load_before = load_average()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            status, body, took = probe(base)
            times.append(took)
            if (status, body) != (200, READY):
                wrong.append((status, body))
            time.sleep(0.1)
        load_after = load_average()
        stop.set()
        calls = sum(worker.result() for worker in workers)
    if failures:
        raise BenchError(f"the load's calls failed: {failures[:3]}")
    times.sort()
    return {
        "load_clients": loaders,
        "probes": len(times),
        "wrong": len(wrong),
        "wrong_sample": wrong[:3],
        "p50_ms": round(percentile(times, 50) or 0, 1),
        "p99_ms": round(percentile(times, 99) or 0, 1),
        "max_ms": round(times[-1], 1) if times else None,
        "load_calls": calls,
        "load_before": load_before,
        "load_after": load_after,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0,8,16", help="load clients, comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0, help="probing per level")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        parser.error("--levels: comma-separated numbers of load clients")
    if any(n < 0 for n in args.levels):
        parser.error("--levels: no negative numbers")
    return args


def default_output(now: datetime) -> Path:
    """bench/results/readyz-<date>-redis.json, -2, -3... when that day already has one."""
    return next_result(f"readyz-{now.date().isoformat()}-redis")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="toolhub-readyz-"))
    rows = []
    try:
        env = base_env(work / "var", 100)
        env["TOOLHUB_EXTRA_TOOL_MODULES"] = "tests.support.tools"
        key = prepare_state(env, work / "setup.log")
        granted = subprocess.run(  # noqa: S603
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", GRANT_CODE],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if f"GRANTED {len(LOAD_TOOLS)}" not in granted.stdout:
            raise BenchError(f"could not grant the load's tools:\n{granted.stderr[-2000:]}")
        with contextlib.ExitStack() as stack:
            env["REDIS_URL"] = stack.enter_context(redis_server(work))
            server = stack.enter_context(daphne(env, work / "daphne.log", None))
            probe(server.base)  # the first probe waits for fresh checks
            for loaders in args.levels:
                rows.append(level(server.base, key, loaders, args.seconds))
                row = rows[-1]
                sys.stdout.write(
                    f"{row['load_clients']:>3} load clients: {row['probes']} probes, "
                    f"{row['wrong']} wrong, p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
                    f"{row['load_calls']} calls, load {row['load_before']}-{row['load_after']}\n"
                )
                sys.stdout.flush()
    except BenchError as exc:
        sys.stderr.write(f"[readyz] failed: {exc}\n")
        return 1
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    now = datetime.now(UTC)
    path = args.output or default_output(now)
    report = {
        "benchmark": "readyz",
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join(["bench/readyz.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "code": code_version(),
        "goal_ms": GOAL_MS,
        "measures": "time from opening a connection to the whole /readyz answer, one probe "
        "every 100 ms, while the load clients call",
        "levels": rows,
    }
    path.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
