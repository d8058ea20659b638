"""Audit chain bench (issue 48): what the chain costs a call (linked as written), and how
fast it is verified.

    .venv/bin/python bench/audit.py                       # SQLite: 400 calls, 100k history
    .venv/bin/python bench/audit.py --database postgres   # own PostgreSQL (or DATABASE_URL)
    .venv/bin/python bench/audit.py --calls 100 --history 10000   # a quick look

In a fresh database (migrated in a temp dir, as bench/history.py does):

  - a no-op call (core__get_current_time) through the API in process (Django's test
    client, an API key), p50 and p99 with the audit triggers in place and with them
    dropped (SQLite) or disabled (PostgreSQL), in alternating blocks of --block calls;
    the difference is what linking a call's record and events costs it;
  - the triggers alone: --probe synthetic calls (a record and two events each, inserted
    by bench/history.py's build_history) with the triggers and without, alternately,
    --probe-rounds times: the difference per call, free of the call path's noise;
  - a synthetic history of --history calls (bench/history.py's build_history: a record
    and two events each, linked by the triggers as they are inserted), walked by
    verify_audit's walk (apps.audit.verify.verify_tenant): entries/s and the process's
    peak RSS growth (the walk is paged: it should not grow with the history).

Writes JSON to bench/results/audit-<date>-<database>.json. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calls import postgres_server, server_env  # noqa: E402
from bench.fanout import code_version  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
TOOL = "core__get_current_time"


def err(line: str) -> None:
    sys.stderr.write(line + "\n")


def _triggers(on: bool) -> None:
    from django.db import connection

    from apps.audit import digests

    if connection.vendor == "sqlite":
        statements = [*digests.SQLITE_DROP, *(digests.sqlite_triggers() if on else [])]
    else:
        verb = "ENABLE" if on else "DISABLE"
        statements = [
            f"ALTER TABLE {table} {verb} TRIGGER {name}"
            for table, names in (
                (digests.RECORDS, ("audit_record_written", "audit_record_changed")),
                (digests.EVENTS, ("audit_event_written", "audit_event_changed")),
            )
            for name in names
        ]
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _calls(client: Any, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.post(
            "/api/v1/invocations/", {"toolId": TOOL}, format="json", HTTP_HOST="localhost"
        )
        took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.content
    return took


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def child(options: argparse.Namespace) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
    django.setup()
    from rest_framework.test import APIClient

    from apps.audit import verify
    from apps.audit.models import AuditEntry
    from apps.tenants.models import Tenant
    from bench.history import build_history
    from tests.conftest import allow, make_agent

    agent = make_agent("bench")
    allow(agent.tenant, TOOL)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
    _calls(client, 20)  # warm-up
    on: list[float] = []
    off: list[float] = []
    for _ in range(max(1, options.calls // options.block)):
        on += _calls(client, options.block)
        _triggers(False)
        off += _calls(client, options.block)
        _triggers(True)
    result: dict[str, Any] = {
        "load_1min": round(os.getloadavg()[0], 2),
        "calls": len(on),
        "call_p50_ms_chained": round(statistics.median(on), 3),
        "call_p50_ms_unchained": round(statistics.median(off), 3),
        "call_p99_ms_chained": _pct(on, 0.99),
        "call_p99_ms_unchained": _pct(off, 0.99),
    }
    result["chain_cost_p50_ms"] = round(
        result["call_p50_ms_chained"] - result["call_p50_ms_unchained"], 3
    )
    # The triggers alone, without the call path's noise: synthetic calls (a record and two
    # events each) inserted with the triggers in place and without, alternately.
    spent = {True: 0.0, False: 0.0}
    for round_ in range(options.probe_rounds):
        for on_now in (True, False):
            _triggers(on_now)
            started = time.perf_counter()
            build_history(options.probe, tenant_slug=f"probe-{round_}-{on_now}", per_run=1000)
            spent[on_now] += time.perf_counter() - started
    _triggers(True)
    probed = options.probe * options.probe_rounds
    result["probe_calls"] = probed
    result["trigger_cost_per_call_us"] = round((spent[True] - spent[False]) / probed * 1e6, 1)
    result["insert_per_call_us_unchained"] = round(spent[False] / probed * 1e6, 1)

    n = options.history
    started = time.perf_counter()
    build_history(n, tenant_slug="history", per_run=1000)
    result["history_calls"] = n
    result["history_insert_s"] = round(time.perf_counter() - started, 1)
    tenant = Tenant.objects.get(slug="history")
    result["history_entries"] = AuditEntry.objects.filter(tenant=tenant).count()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    walk = verify.verify_tenant(tenant)
    took = time.perf_counter() - started
    assert walk.broken is None, walk.broken
    result["verify_entries_per_s"] = round(walk.checked / took)
    result["verify_s"] = round(took, 1)
    result["verify_peak_rss_growth_mb"] = round(
        (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024, 1
    )
    sys.stdout.write("AUDIT_RESULT=" + json.dumps(result) + "\n")


def measure(options: argparse.Namespace, database: str) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolhub-audit-")))
        env = server_env(work)
        if database == "sqlite":
            env["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
        else:
            given = env.get("DATABASE_URL", "")
            env["DATABASE_URL"] = (
                given if given.startswith("postgres") else stack.enter_context(postgres_server())
            )
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run(  # noqa: S603
            [*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True, capture_output=True
        )
        command = [sys.executable, __file__, "--child", "--calls", str(options.calls)]
        command += ["--block", str(options.block), "--history", str(options.history)]
        command += ["--probe", str(options.probe), "--probe-rounds", str(options.probe_rounds)]
        done = subprocess.run(  # noqa: S603
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False
        )
        for line in done.stdout.splitlines():
            if line.startswith("AUDIT_RESULT="):
                return dict(json.loads(line.split("=", 1)[1]))
        raise RuntimeError(f"the measuring process failed ({done.returncode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--probe", type=int, default=5000, help="synthetic calls a round")
    parser.add_argument("--probe-rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output")
    options = parser.parse_args()
    if options.child:
        child(options)
        return
    database = "postgresql" if options.database == "postgres" else "sqlite"
    row = measure(options, database)
    result = {
        "database": database,
        "measured_at": datetime.now(UTC).isoformat(),
        "code": code_version(),
        **row,
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    stem = f"audit-{datetime.now(UTC):%Y-%m-%d}-{database}"
    path = Path(options.output) if options.output else RESULTS_DIR / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in row.items():
        sys.stdout.write(f"| {key} | {value} |\n")
    err(f"wrote {path}")


if __name__ == "__main__":
    main()
