"""Call-path benchmark (issue 13): what a tool call costs on toolhub as deployed.

    .venv/bin/python bench/calls.py                # full run (many minutes: 100k calls)
    .venv/bin/python bench/calls.py --quick        # reduced counts, about a minute
    .venv/bin/python bench/calls.py --contextforge # add ContextForge's row (scratch venv)

It starts one Daphne (`daphne toolhub.asgi:application`, not in debug mode) on a throwaway
SQLite database, or on DATABASE_URL when one is given (PostgreSQL), and a keep-alive HTTP
upstream on 127.0.0.1 in a process of its own. It then measures, side by side in the same
run, and prints every figure with its goal and whether it is met:

  1 no-op call (core__get_current_time) p50 added over the bare endpoint; its p99/p50
  2 core__http_request on the local upstream: p50 added over direct upstream + bare
  3 20 concurrent clients: no-op and catalog throughput as a share of the bare
    endpoint's; p99/p50 of the no-op under that load
  4 50 concurrent calls to a tool that waits 1 s: wall time
  5 argument validation (the runner's validate_args) for a 10-field schema, p50
  7 Daphne's RSS after the long run over its RSS after the short one

The bare endpoint is GET /api/v1/invocations/<id>/ (API key authentication, one SELECT,
the record's serializer): the cheapest real authenticated DRF endpoint toolhub has.
Goals 6 and 8 have their own benches (decision.py, fanout.py). Writes JSON to
bench/results/calls-<date>.json. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fanout import (  # noqa: E402  (after the path is set)
    BenchError,
    code_version,
    free_port,
    load_average,
    stop,
    tail,
)

RESULTS_DIR = ROOT / "bench" / "results"
VENV_BIN = Path(sys.executable).parent
NOOP = "core__get_current_time"
HTTP = "core__http_request"
WAIT = "test__counted_wait"  # tests/support/tools.py: waits `ms`, cooperative, timeout 5 s

# Runs inside `manage.py shell -c`: a tenant, its key, a policy listing the three tools
# with execute_tool for the agents group, a connection to the local upstream granted and
# usable; prints the key and the connection id.
SETUP_CODE = """
from guardian.shortcuts import assign_perm
from apps.connections.models import Connection, Grant
from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool

tenant = Tenant.objects.create(slug="bench", name="Bench")
_, raw = ApiKey.objects.issue(tenant, "agent:bench", name="call-path benchmark")
policy = Policy.objects.create(tenant=tenant, name="bench")
group = agents_group(tenant)
for tool in Tool.objects.filter(pk__in=TOOL_IDS):
    policy.tools.add(tool)
    assign_perm("tools.execute_tool", group, tool)
connection = Connection(tenant=tenant, name="upstream", kind="bearer",
                        allowed_hosts=["127.0.0.1"], allow_private_network=True)
connection.set_secret(token="bench-token")
connection.full_clean()
connection.save()
Grant.objects.create(tenant=tenant, connection=connection, principal="agent:bench")
assign_perm("connections.use_connection", group, connection)
print("BENCH_KEY=" + raw)
print("BENCH_CONNECTION=" + str(connection.pk))
""".replace("TOOL_IDS", repr([NOOP, HTTP, WAIT]))

# The upstream: HTTP/1.1 keep-alive, answers every GET with a small JSON body.
UPSTREAM_CODE = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes
    def do_GET(self):
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def log(message: str) -> None:
    sys.stderr.write(f"[calls] {message}\n")
    sys.stderr.flush()


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes


def server_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLHUB_DEBUG"}}
    env.update(
        {
            "TOOLHUB_VAR_DIR": str(var_dir),
            "TOOLHUB_DEBUG": "0",  # debug mode records every query
            "TOOLHUB_SECRET_KEY": secrets.token_urlsafe(50),
            "TOOLHUB_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools",
            "TOOLHUB_EMBEDDED_WORKER": "0",
            "TOOLHUB_LOG_LEVEL": "WARNING",  # one INFO line per call would be measured too
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def prepare(env: dict[str, str], log_path: Path) -> tuple[str, str]:
    manage = [sys.executable, str(ROOT / "manage.py")]
    with log_path.open("ab") as sink:
        done = subprocess.run(  # noqa: S603
            [*manage, "migrate", "--noinput"], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    if done.returncode:
        raise BenchError(f"manage.py migrate failed:\n{tail(log_path)}")
    shell = subprocess.run(  # noqa: S603
        [*manage, "shell", "-c", SETUP_CODE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    found = dict(
        line.split("=", 1) for line in shell.stdout.splitlines() if line.startswith("BENCH_")
    )
    if "BENCH_KEY" not in found:
        raise BenchError(f"setup failed:\n{shell.stdout}\n{shell.stderr}")
    return found["BENCH_KEY"].strip(), found["BENCH_CONNECTION"].strip()


def wait_for(port: int, path: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{what} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.2)
    raise BenchError(f"{what} did not come up within 60 s")


@contextlib.contextmanager
def process(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[Any]:
    with log_path.open("ab") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)  # noqa: S603
    try:
        yield proc
    finally:
        stop(proc, command[0])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- client


class Client:
    """One keep-alive connection (like an agent's HTTP client), one request at a time."""

    def __init__(self, port: int, key: str = "") -> None:
        self.port = port
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def timed(self, method: str, path: str, body: Any = None) -> float:
        started = time.perf_counter()
        status, payload = self.request(method, path, body)
        elapsed = (time.perf_counter() - started) * 1000
        if status >= 300 or (b'"ok":false' in payload):
            raise BenchError(f"{method} {path} -> {status}: {payload[:300]!r}")
        return elapsed


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Target:
    """A request the bench repeats: method, path, body."""

    method: str
    path: str
    body: Any = None


def sequential(client: Client, targets: dict[str, Target], n: int) -> dict[str, list[float]]:
    """n rounds, each target once per round (interleaved: drift hits all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(n):
        for name, target in targets.items():
            times[name].append(client.timed(target.method, target.path, target.body))
    return times


def concurrent(port: int, key: str, target: Target, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` threads, each with its own keep-alive connection, for `seconds`."""
    stop_at = time.monotonic() + seconds
    per_client: list[list[float]] = [[] for _ in range(clients)]

    def work(index: int) -> None:
        client = Client(port, key)
        while time.monotonic() < stop_at:
            per_client[index].append(client.timed(target.method, target.path, target.body))

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(work, range(clients)))
    wall = time.monotonic() - started
    times = [t for ts in per_client for t in ts]
    return {
        "requests": len(times),
        "per_s": round(len(times) / wall, 1),
        "p50_ms": round(pct(times, 50), 2),
        "p99_ms": round(pct(times, 99), 2),
    }


# ---------------------------------------------------------------- goals


@dataclass
class Figure:
    goal: str
    value: float | None
    unit: str
    limit: float
    higher_is_better: bool = False
    detail: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def line(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        value = "n/a" if self.value is None else f"{self.value:g} {self.unit}"
        verdict = {True: "MET", False: "NOT MET", None: "NOT MEASURED"}[self.met]
        return f"{self.goal:<58} {value:>14}  goal {sign} {self.limit:g} {self.unit:<4} {verdict}"


def validation_p50_us(samples: int) -> tuple[float, float]:
    """Goal 5 in this process, on a 10-field schema: the schema check the runner makes
    (pydantic, strict, from the JSON text), and the runner's whole step 5 (validate_args:
    the 8 KB size check, that schema check and the request hash an idempotency key and an
    approval are bound to)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
    os.environ.setdefault("TOOLHUB_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ.setdefault("TOOLHUB_VAR_DIR", tempfile.mkdtemp(prefix="toolhub-bench-driver-"))
    os.environ.setdefault(
        "TOOLHUB_ENCRYPTION_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode()
    )
    import django

    django.setup()
    from types import SimpleNamespace

    from pydantic import Field

    from apps.invocations import runner
    from apps.tools.contracts import ToolParams

    class TenFields(ToolParams):
        query: str = Field(max_length=200)
        limit: int = Field(ge=1, le=100)
        offset: int = 0
        lang: str = "en"
        safe: bool = True
        score: float = 0.5
        tags: list[str] = Field(default_factory=list)
        region: str | None = None
        sort: str = "relevance"
        fresh: bool = False

    args = {
        "query": "weather in Lyon",
        "limit": 10,
        "offset": 0,
        "lang": "fr",
        "safe": True,
        "score": 0.75,
        "tags": ["a", "b"],
        "region": "eu",
        "sort": "date",
        "fresh": True,
    }
    registered = SimpleNamespace(contract=SimpleNamespace(params=TenFields))
    tool = SimpleNamespace(id="bench__ten_fields")
    encoded = json.dumps(args)
    schema_times = []
    for _ in range(samples):
        started = time.perf_counter_ns()
        TenFields.model_validate_json(encoded, strict=True)
        schema_times.append((time.perf_counter_ns() - started) / 1000)
    times = []
    for _ in range(samples):
        call = SimpleNamespace(
            registered=registered, tool=tool, args_problem=None, raw_args=args, connection_id=""
        )
        started = time.perf_counter_ns()
        runner.validate_args(call)  # type: ignore[arg-type]
        times.append((time.perf_counter_ns() - started) / 1000)
    return round(statistics.median(schema_times), 2), round(statistics.median(times), 2)


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("django", "djangorestframework", "daphne", "channels", "pydantic"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "packages": versions,
    }


# ---------------------------------------------------------------- the run


def run(options: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="toolhub-bench-calls-"))
    env = server_env(work)
    database = "postgresql" if env.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    if database == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
    log(f"state in {work} ({database})")
    key, connection_id = prepare(env, work / "setup.log")
    port, upstream_port = free_port(), free_port()
    daphne_cmd = [
        str(VENV_BIN / "daphne"),
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "toolhub.asgi:application",
    ]
    upstream_cmd = [sys.executable, "-c", UPSTREAM_CODE, str(upstream_port)]
    figures: list[Figure] = []
    raw: dict[str, Any] = {}
    try:
        with (
            process(upstream_cmd, env, work / "upstream.log") as upstream,
            process(daphne_cmd, env, work / "daphne.log") as daphne,
        ):
            wait_for(upstream_port, "/", upstream, "upstream")
            wait_for(port, "/healthz", daphne, "daphne")
            client = Client(port, key)
            status, body = client.request("POST", "/api/v1/invocations/", {"toolId": NOOP})
            if status != 200:
                raise BenchError(f"warm-up call failed: {status} {body[:300]!r}")
            record_id = json.loads(body)["invocationId"]
            upstream_url = f"http://127.0.0.1:{upstream_port}/"
            targets = {
                "bare": Target("GET", f"/api/v1/invocations/{record_id}/"),
                "noop": Target("POST", "/api/v1/invocations/", {"toolId": NOOP}),
                "http": Target(
                    "POST",
                    "/api/v1/invocations/",
                    {"toolId": HTTP, "connectionId": connection_id, "args": {"url": upstream_url}},
                ),
                "catalog": Target("GET", "/api/v1/tools/"),
            }
            sequential(client, targets, options.warmup)
            raw["load_before"] = load_average()
            seq = sequential(client, targets, options.calls)
            direct = Client(upstream_port)
            direct_ms = [direct.timed("GET", "/") for _ in range(options.calls)]
            p50 = {name: pct(times, 50) for name, times in seq.items()}
            p50["direct"] = pct(direct_ms, 50)
            raw["sequential"] = {
                name: {"p50_ms": round(pct(t, 50), 3), "p99_ms": round(pct(t, 99), 3)}
                for name, t in {**seq, "direct": direct_ms}.items()
            }
            noop_p99 = pct(seq["noop"], 99)
            figures.append(
                Figure(
                    "1 no-op call: p50 added over the bare endpoint",
                    round(p50["noop"] - p50["bare"], 2),
                    "ms",
                    1.5,
                    detail=f"no-op {p50['noop']:.2f} ms, bare {p50['bare']:.2f} ms",
                )
            )
            figures.append(
                Figure("1 no-op call: p99 / p50", round(noop_p99 / p50["noop"], 2), "x", 3)
            )
            figures.append(
                Figure(
                    "2 core__http_request: p50 added over direct + bare",
                    round(p50["http"] - p50["direct"] - p50["bare"], 2),
                    "ms",
                    3,
                    detail=f"http {p50['http']:.2f}, direct {p50['direct']:.2f}",
                )
            )
            load = {
                name: concurrent(port, key, targets[name], options.clients, options.seconds)
                for name in ("bare", "noop", "catalog")
            }
            raw["concurrent"] = load
            figures.append(
                Figure(
                    f"3 {options.clients} clients: no-op throughput / bare",
                    round(100 * load["noop"]["per_s"] / load["bare"]["per_s"], 1),
                    "%",
                    50,
                    higher_is_better=True,
                    detail=f"{load['noop']['per_s']}/s vs {load['bare']['per_s']}/s",
                )
            )
            figures.append(
                Figure(
                    f"3 {options.clients} clients: catalog throughput / bare",
                    round(100 * load["catalog"]["per_s"] / load["bare"]["per_s"], 1),
                    "%",
                    80,
                    higher_is_better=True,
                    detail=f"{load['catalog']['per_s']}/s",
                )
            )
            figures.append(
                Figure(
                    f"3 {options.clients} clients: no-op p99 / p50",
                    round(load["noop"]["p99_ms"] / load["noop"]["p50_ms"], 2),
                    "x",
                    5,
                )
            )
            tally = work / "tally.log"
            tally.touch()

            def wait_call(i: int) -> float:
                body = {"toolId": WAIT, "args": {"path": str(tally), "token": f"t{i}", "ms": 1000}}
                return Client(port, key).timed("POST", "/api/v1/invocations/", body)

            started = time.monotonic()
            with ThreadPoolExecutor(options.sleepers) as pool:
                list(pool.map(wait_call, range(options.sleepers)))
            figures.append(
                Figure(
                    f"4 {options.sleepers} concurrent 1 s calls: wall time",
                    round(time.monotonic() - started, 2),
                    "s",
                    1.5,
                )
            )
            short, long = options.memory_calls
            memory = []
            for target_calls in (short, long):
                each = (target_calls - raw.get("memory_done", 0)) // 4
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(client_noop, [(port, key, each)] * 4))
                raw["memory_done"] = target_calls
                memory.append(rss_kb(daphne.pid))
            raw["rss_kb"] = dict(zip((str(short), str(long)), memory, strict=True))
            figures.append(
                Figure(
                    f"7 RSS after {long} calls over RSS after {short}",
                    round(100 * (memory[1] / memory[0] - 1), 1),
                    "%",
                    10,
                    detail=f"{memory[0]} kB -> {memory[1]} kB",
                )
            )
            raw["load_after"] = load_average()
    finally:
        if not options.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    schema_us, step_us = validation_p50_us(options.validations)
    figures.append(
        Figure(
            "5 argument validation, 10-field schema: p50",
            schema_us,
            "µs",
            5,
            detail=f"the runner's whole step 5 with size check and request hash: {step_us} µs",
        )
    )
    if options.contextforge:
        raw["contextforge"] = contextforge_row()
    return {"database": database, "figures": figures, "raw": raw}


def client_noop(job: tuple[int, str, int]) -> None:
    port, key, n = job
    client = Client(port, key)
    for _ in range(n):
        client.timed("POST", "/api/v1/invocations/", {"toolId": NOOP})


def contextforge_row() -> dict[str, Any]:
    """ContextForge from PyPI in a scratch virtualenv (never a toolhub dependency)."""
    venv = Path(tempfile.mkdtemp(prefix="toolhub-bench-contextforge-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # noqa: S603
        done = subprocess.run(  # noqa: S603
            [str(venv / "bin" / "pip"), "install", "-q", "mcp-contextforge-gateway"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode:
            note = "ContextForge could not be installed: " + done.stderr.strip()[-300:]
            log(note)
            return {"installed": False, "note": note}
        version = subprocess.run(  # noqa: S603
            [
                str(venv / "bin" / "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('mcp-contextforge-gateway'))",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        note = (
            f"ContextForge {version} installed; its call row is not measured by this bench yet "
            "(see docs/performance.md for the figures taken by hand in issue 13)"
        )
        log(note)
        return {"installed": True, "version": version, "note": note}
    finally:
        import shutil

        shutil.rmtree(venv, ignore_errors=True)


def report(result: dict[str, Any], options: argparse.Namespace) -> Path:
    figures: list[Figure] = result["figures"]
    out(
        f"toolhub call path, {result['database']}, one Daphne process; "
        f"load {result['raw'].get('load_before')} -> {result['raw'].get('load_after')}"
    )
    for figure in figures:
        out(figure.line() + (f"  ({figure.detail})" if figure.detail else ""))
    if "contextforge" in result["raw"]:
        out("ContextForge: " + result["raw"]["contextforge"]["note"])
    RESULTS_DIR.mkdir(exist_ok=True)
    path = (
        Path(options.output)
        if options.output
        else RESULTS_DIR / (f"calls-{datetime.now(UTC):%Y-%m-%d}-{result['database']}.json")
    )
    payload = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": result["database"],
        "figures": [
            {
                "goal": f.goal,
                "value": f.value,
                "unit": f.unit,
                "limit": f.limit,
                "met": f.met,
                "detail": f.detail,
            }
            for f in figures
        ],
        "raw": result["raw"],
        "options": vars(options),
        "code": code_version(),
        "machine": machine(),
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    out(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="sequential samples per row")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10, help="per concurrent row")
    parser.add_argument("--sleepers", type=int, default=50)
    parser.add_argument("--validations", type=int, default=20000)
    parser.add_argument(
        "--memory-calls",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=(10_000, 100_000),
        help="RSS is read after this many no-op calls, then after that many (two numbers)",
    )
    parser.add_argument("--quick", action="store_true", help="reduced counts (about a minute)")
    parser.add_argument("--contextforge", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs)")
    parser.add_argument("--output")
    options = parser.parse_args(argv)
    if options.quick:
        options.calls, options.seconds, options.memory_calls = 300, 4, (2_000, 6_000)
    try:
        result = run(options)
    except BenchError as exc:
        log(str(exc))
        return 1
    report(result, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
