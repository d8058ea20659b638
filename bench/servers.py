"""Which ASGI server (issue 13): toolhub's own app under Daphne, uvicorn, hypercorn and granian.

    .venv/bin/python bench/servers.py                 # SQLite, 1,000 samples, 10 s per load row
    .venv/bin/python bench/servers.py --quick         # 300 samples, 4 s
    .venv/bin/python bench/servers.py --database postgres
    .venv/bin/python bench/calls.py --servers         # the same, after the call-path rows

Daphne keeps the WebSockets whatever this says (toolhub's streams are built on Channels and
deployed under it); the question is whether Daphne's own per-request cost is what stands in
the way of the HTTP figures. Each server serves the same `toolhub.asgi:application`, one
process, on the same database, in turn (never two at once): the bare endpoint (`GET
/api/v1/invocations/<id>/` with the API key, as in calls.py) and `GET /healthz`, sequential
p50 and the throughput of 20 keep-alive clients. Access logs are off for all four (Daphne
`-v 0`; deployed Daphne writes one line per request, which calls.py's rows include).

uvicorn (with uvloop and httptools), hypercorn and granian are pip-installed into a temp
dir the bench creates and removes, appended to the server process's sys.path (toolhub's
own packages keep precedence): they are never toolhub dependencies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calls import (  # noqa: E402  (after the path is set)
    NOOP,
    RESULTS_DIR,
    BenchError,
    Client,
    Target,
    code_version,
    concurrent,
    daphne_command,
    deployment,
    free_port,
    load_average,
    log,
    machine,
    out,
    pct,
    prepare,
    process,
    sequential,
    wait_for,
)

SERVERS = ("daphne", "uvicorn", "hypercorn", "granian")
PACKAGES = ("uvicorn[standard]", "hypercorn", "granian")
APP = "toolhub.asgi:application"

# Runs a server's own command line with the scratch packages after toolhub's on sys.path
# (so a package both have, e.g. h11 or websockets, is toolhub's version).
BOOT = """
import runpy, sys
sys.path.append(sys.argv[1])
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

VERSIONS = """
import json, sys
sys.path.append(sys.argv[1])
from importlib import metadata
print(json.dumps({name: metadata.version(name) for name in sys.argv[2:]}))
"""


def install(target: Path) -> dict[str, str]:
    log(f"installing {', '.join(PACKAGES)} into {target}")
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *PACKAGES],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode:
        raise BenchError("could not install the servers: " + done.stderr.strip()[-500:])
    names = ["daphne", "uvicorn", "uvloop", "httptools", "hypercorn", "granian"]
    shown = subprocess.run(  # noqa: S603
        [sys.executable, "-c", VERSIONS, str(target), *names],
        capture_output=True,
        text=True,
        check=True,
    )
    versions: dict[str, str] = json.loads(shown.stdout)
    return versions


def command(name: str, port: int, packages: Path) -> list[str]:
    boot = [sys.executable, "-c", BOOT, str(packages)]
    host = "127.0.0.1"
    if name == "daphne":
        return [*daphne_command(port)[:-1], "-v", "0", APP]
    if name == "uvicorn":
        return [*boot, "uvicorn", "--host", host, "--port", str(port), "--lifespan", "off",
                "--no-access-log", "--log-level", "warning", APP]  # fmt: skip
    if name == "hypercorn":
        return [*boot, "hypercorn", "--bind", f"{host}:{port}", "--log-level", "WARNING", APP]
    if name == "granian":
        # asginl: ASGI without the lifespan protocol, which Channels' router refuses.
        return [*boot, "granian", "--interface", "asginl", "--host", host, "--port", str(port),
                "--workers", "1", "--log-level", "warning", APP]  # fmt: skip
    raise ValueError(name)


def compare(
    env: dict[str, str], work: Path, key: str, options: argparse.Namespace
) -> dict[str, Any]:
    """Each server in turn on the same state, `--rounds` times round-robin (drift on a shared
    machine then hits all of them alike); each figure is the median over the rounds."""
    packages = work / "servers"
    versions = install(packages)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SERVERS}
    record = ""
    for _ in range(options.rounds):
        for name in SERVERS:
            port = free_port()
            with process(command(name, port, packages), env, work / f"{name}.log") as server:
                wait_for(port, "/healthz", server, name)
                client = Client(port, key)
                if not record:
                    status, body = client.request("POST", "/api/v1/invocations/", {"toolId": NOOP})
                    if status != 200:
                        raise BenchError(f"{name}: the no-op call failed: {status} {body[:300]!r}")
                    record = json.loads(body)["invocationId"]
                targets = {
                    "bare": Target("GET", f"/api/v1/invocations/{record}/"),
                    "healthz": Target("GET", "/healthz"),
                }
                sequential(client, targets, options.warmup)
                seq = sequential(client, targets, options.calls)
                run: dict[str, dict[str, Any]] = {
                    target: {
                        "p50_ms": pct(seq[target], 50),
                        "p99_ms": pct(seq[target], 99),
                        "concurrent": concurrent(
                            port, key, targets[target], options.clients, options.seconds
                        ),
                    }
                    for target in targets
                }
                runs[name].append(run)
                bare, health = (
                    run["bare"]["concurrent"]["per_s"],
                    run["healthz"]["concurrent"]["per_s"],
                )
                log(f"{name}: bare {bare}/s, healthz {health}/s")
    rows = {
        name: {
            target: {
                "p50_ms": round(statistics.median(r[target]["p50_ms"] for r in results), 3),
                "p99_ms": round(statistics.median(r[target]["p99_ms"] for r in results), 3),
                "per_s": round(
                    statistics.median(r[target]["concurrent"]["per_s"] for r in results), 1
                ),
                "load_p50_ms": round(
                    statistics.median(r[target]["concurrent"]["p50_ms"] for r in results), 2
                ),
            }
            for target in ("bare", "healthz")
        }
        for name, results in runs.items()
    }
    return {"versions": versions, "rounds": options.rounds, "rows": rows, "runs": runs}


def table(result: dict[str, Any], clients: int) -> list[str]:
    versions = result["versions"]
    lines = [
        f"ASGI servers, one process each, same app and database, access logs off; "
        f"medians of {result['rounds']} round(s)",
        f"{'server':<20} {'bare p50':>9} {f'bare {clients} cl.':>12} "
        f"{'healthz p50':>12} {f'healthz {clients} cl.':>15}",
    ]
    for name, row in result["rows"].items():
        label = f"{name} {versions.get(name, '')}"
        lines.append(
            f"{label:<20} {row['bare']['p50_ms']:>6.2f} ms {row['bare']['per_s']:>10}/s "
            f"{row['healthz']['p50_ms']:>9.2f} ms {row['healthz']['per_s']:>13}/s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=1, help="round-robin passes; medians")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", help="default: bench/results/servers-<date>-<database>.json")
    options = parser.parse_args(argv)
    if options.quick:
        options.calls, options.seconds = 300, 4
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind
    work = Path(tempfile.mkdtemp(prefix="toolhub-bench-servers-"))
    database = "postgresql" if options.database == "postgres" else "sqlite"
    started = datetime.now(UTC)
    try:
        with contextlib.ExitStack() as stack:
            env = deployment(options, work, stack)
            key, _ = prepare(env, work / "setup.log")
            load_before = load_average()
            result = compare(env, work, key, options)
            load_after = load_average()
    except BenchError as exc:
        log(str(exc))
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for line in table(result, options.clients):
        out(line)
    out(f"load {load_before} -> {load_after}")
    payload = {
        "date": started.isoformat(timespec="seconds"),
        "database": database,
        "load_before": load_before,
        "load_after": load_after,
        **result,
        "options": vars(options),
        "code": code_version(),
        "machine": machine(database),
    }
    path = Path(options.output or RESULTS_DIR / f"servers-{started:%Y-%m-%d}-{database}.json")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    out(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
