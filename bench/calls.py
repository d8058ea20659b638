"""Call-path benchmark (issue 13): what a tool call costs on toolhub as deployed.

    .venv/bin/python bench/calls.py                      # full run, SQLite (100k calls: long)
    .venv/bin/python bench/calls.py --database postgres  # the scale-out deployment
    .venv/bin/python bench/calls.py --quick              # reduced counts, a few minutes
    .venv/bin/python bench/calls.py --servers            # add Daphne vs uvicorn, hypercorn, granian
    .venv/bin/python bench/calls.py --contextforge       # add ContextForge's row (scratch venv)

Embedded mode (default): throwaway SQLite in a temp dir and the in-memory channel layer.
Scale-out mode (--database postgres): a throwaway PostgreSQL server of its own (unix socket
in a temp dir) and a throwaway redis-server (the scale-out deployment's channel layer), or
the PostgreSQL of DATABASE_URL when one is set. It starts one Daphne (`daphne
toolhub.asgi:application`, not in debug mode) and a keep-alive HTTP upstream on 127.0.0.1
in a process of its own, then measures, side by side in the same run, and prints every
figure with its goal and whether it is met:

  1 no-op call (core__get_current_time) p50 added over the bare endpoint; its p99/p50
  2 core__http_request on the local upstream: p50 added over direct upstream + bare
  3 20 concurrent clients: no-op and catalog throughput as a share of the bare
    endpoint's; p99/p50 of the no-op under that load; one Daphne process per core
    (each on its own port, the clients spread evenly over them) against one process:
    no-op throughput ratio
  4 50 concurrent calls to a tool that waits 1 s: wall time
  5 argument validation (the runner's validate_args) for a 10-field schema, p50
  7 Daphne's RSS after the long run over its RSS after the short one

The bare endpoint is GET /api/v1/invocations/<id>/ (API key authentication, one SELECT,
the record's serializer): the cheapest real authenticated DRF endpoint toolhub has.
Goals 6 and 8 have their own benches (decision.py, fanout.py). Writes JSON to
bench/results/calls-<date>-<database>.json. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import glob
import http.client
import json
import os
import platform
import secrets
import selectors
import shutil
import signal
import socket
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
    cpu_seconds,
    free_port,
    load_average,
    redis_server,
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
def process(
    command: list[str],
    env: dict[str, str],
    log_path: Path,
    pass_fds: tuple[int, ...] = (),
    cwd: Path = ROOT,
) -> Iterator[Any]:
    with log_path.open("ab") as sink:
        proc = subprocess.Popen(  # noqa: S603
            command, cwd=cwd, env=env, stdout=sink, stderr=sink, pass_fds=pass_fds
        )
    try:
        yield proc
    finally:
        stop(proc, command[0])


def daphne_command(port: int, cpu: int | None = None) -> list[str]:
    """Daphne as deployed (docs/deployment.md), on a port of its own; with `cpu`, pinned
    to that core (`taskset`, as the deployment's "one process per core" suggests)."""
    pinned = [] if cpu is None else ["taskset", "-c", str(cpu)]
    return [
        *pinned,
        str(VENV_BIN / "daphne"),
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "toolhub.asgi:application",
    ]


def usable_cores() -> list[int]:
    """The cores this process may run on (a container's cpuset may not start at 0)."""
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def daphne_processes(
    env: dict[str, str], work: Path, count: int, pin: bool = False
) -> Iterator[tuple[list[int], list[Any]]]:
    """`count` Daphne processes, each on a port of its own, as deployed behind a load
    balancer (docs/deployment.md), the i-th pinned to the i-th usable core when `pin`;
    yields (ports, processes) once every one answers."""
    ports = [free_port() for _ in range(count)]
    cores = usable_cores()
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                process(
                    daphne_command(port, cores[index % len(cores)] if pin else None),
                    env,
                    work / f"daphne-{count}x-{index}.log",
                )
            )
            for index, port in enumerate(ports)
        ]
        for port, proc in zip(ports, procs, strict=True):
            wait_for(port, "/healthz", proc, f"daphne on port {port}")
        yield ports, procs


def pg_bin_dir() -> Path:
    for candidate in [
        os.environ.get("PG_BIN", ""),
        "/usr/lib/postgresql/15/bin",
        *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True),
    ]:
        if candidate and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    raise BenchError(
        "--database postgres needs the PostgreSQL server binaries (initdb, pg_ctl; "
        "Debian/Ubuntu: `apt-get install postgresql-15`), or DATABASE_URL set to a server"
    )


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL server: its data and its unix socket in a temp dir under /tmp
    (socket paths are limited to ~107 bytes), no TCP listener, default durability (fsync,
    synchronous_commit: as deployed). PostgreSQL refuses to run as root, so as root its
    tools run as the postgres user. Yields the DATABASE_URL."""
    binaries = pg_bin_dir()
    base = Path(tempfile.mkdtemp(prefix="toolhub-bench-pg-", dir="/tmp"))
    base.chmod(0o755)
    as_root = os.geteuid() == 0
    if as_root:
        shutil.chown(base, "postgres", "postgres")

    def pg(*args: str) -> None:
        command = [str(binaries / args[0]), *args[1:]]
        if as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(  # noqa: S603
            command, cwd=base, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode:
            raise BenchError(
                f"{args[0]} failed: {done.stderr.strip()[-500:]}\n{tail(base / 'log')}"
            )

    data = str(base / "data")
    started = False
    try:
        pg("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-k {base} -c listen_addresses='' -c max_connections=300"
        pg("pg_ctl", "-D", data, "-o", options, "-w", "-t", "60", "-l", str(base / "log"), "start")
        started = True
        pg("createdb", "-h", str(base), "-U", "postgres", "toolhub")
        yield f"postgresql://postgres@{str(base).replace('/', '%2F')}/toolhub"
    finally:
        if started:
            with contextlib.suppress(BenchError, subprocess.TimeoutExpired):
                pg("pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "30", "stop")
        shutil.rmtree(base, ignore_errors=True)


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
        if status >= 300 or b'"ok":false' in payload or b'"isError":true' in payload:
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


class _Connection:
    """One client of `concurrent`: a keep-alive connection, the request it repeats, the
    answer read so far and how long each answer took."""

    def __init__(self, port: int, request: bytes) -> None:
        self.port = port
        self.request = request
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.sent_at = 0.0
        self.resent = False
        self.times: list[float] = []

    def open(self) -> socket.socket:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        return self.sock

    def send(self) -> None:
        assert self.sock is not None
        self.sent_at = time.perf_counter()
        # A connection the server has closed fails here or in the next recv: both come
        # back as a closed connection from the selector (an end of file or a reset).
        with contextlib.suppress(ConnectionError):
            self.sock.sendall(self.request)


def request_bytes(port: int, key: str, target: Target) -> bytes:
    """The whole HTTP/1.1 request, encoded once (what Client sends for it)."""
    body = json.dumps(target.body).encode() if target.body is not None else b""
    head = [f"{target.method} {target.path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if key:
        head.append(f"Authorization: Bearer {key}")
    head += ["Content-Type: application/json", f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(head).encode() + body


def parse_response(buffer: bytes) -> tuple[int, bytes, bytes, bool] | None:
    """(status, body, what follows it, whether the server closes) once `buffer` holds a
    whole response (Content-Length or chunked), None while it does not yet."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buffer[:end].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked, close = None, False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            close = value == b"close"
    at = end + 4
    if chunked:
        body = b""
        while True:
            eol = buffer.find(b"\r\n", at)
            if eol < 0:
                return None
            size = int(buffer[at:eol].split(b";")[0], 16)
            if len(buffer) < eol + 4 + size:
                return None
            body += buffer[eol + 2 : eol + 2 + size]
            at = eol + 4 + size
            if size == 0:
                return status, body, buffer[at:], close
    if length is None:
        raise BenchError(f"an answer with neither Content-Length nor chunks: {lines[:3]!r}")
    if len(buffer) < at + length:
        return None
    return status, buffer[at : at + length], buffer[at + length :], close


def concurrent(
    port: int | list[int], key: str, target: Target, clients: int, seconds: float
) -> dict[str, Any]:
    """`clients` keep-alive connections, each sending its next request as soon as its
    answer is in, for `seconds`. Given several ports, the clients are spread over them in
    turn, as evenly as they divide (a load balancer's share of connections).

    One thread serves every connection from one selector, each request encoded once: the
    load takes as little of the cores it shares with the server as it can (a quarter of
    the CPU per request that 20 threads with http.client took, which also handed Python's
    lock between them on every answer). Every answer is checked as Client.timed checks it;
    a connection the server closed is opened again and its request sent once more."""
    ports = port if isinstance(port, list) else [port]
    selector = selectors.DefaultSelector()
    conns = []
    for index in range(clients):
        at = ports[index % len(ports)]
        conn = _Connection(at, request_bytes(at, key, target))
        selector.register(conn.open(), selectors.EVENT_READ, conn)
        conns.append(conn)
    started = time.monotonic()
    stop_at = started + seconds
    for conn in conns:
        conn.send()
    active = len(conns)
    try:
        while active:
            ready = selector.select(60)
            if not ready:
                raise BenchError(f"{target.method} {target.path}: no answer in 60 s")
            for item, _ in ready:
                conn = item.data
                assert conn.sock is not None
                try:
                    chunk = conn.sock.recv(65536)
                except ConnectionError:  # reset by the server
                    chunk = b""
                if not chunk:  # closed by the server: once per request, as Client retries
                    if conn.resent:
                        raise BenchError(f"{target.method} {target.path}: connection closed")
                    selector.unregister(conn.sock)
                    conn.sock.close()
                    selector.register(conn.open(), selectors.EVENT_READ, conn)
                    conn.resent = True
                    conn.send()
                    continue
                conn.buffer += chunk
                answer = parse_response(conn.buffer)
                if answer is None:
                    continue
                status, payload, conn.buffer, close = answer
                conn.times.append((time.perf_counter() - conn.sent_at) * 1000)
                conn.resent = False
                if status >= 300 or b'"ok":false' in payload or b'"isError":true' in payload:
                    raise BenchError(
                        f"{target.method} {target.path} -> {status}: {payload[:300]!r}"
                    )
                if close:
                    selector.unregister(conn.sock)
                    conn.sock.close()
                    selector.register(conn.open(), selectors.EVENT_READ, conn)
                if time.monotonic() < stop_at:
                    conn.send()
                else:
                    selector.unregister(conn.sock)
                    conn.sock.close()
                    active -= 1
    finally:
        for conn in conns:
            if conn.sock is not None:
                conn.sock.close()
        selector.close()
    wall = time.monotonic() - started
    times = [t for conn in conns for t in conn.times]
    return {
        "requests": len(times),
        "requests_per_process": [
            sum(len(conn.times) for conn in conns if conn.port == at) for at in ports
        ],
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
    if "TOOLHUB_VAR_DIR" not in os.environ:  # this process's settings only have to load
        driver_dir = tempfile.mkdtemp(prefix="toolhub-bench-driver-")
        atexit.register(shutil.rmtree, driver_dir, True)
        os.environ["TOOLHUB_VAR_DIR"] = driver_dir
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


def machine(database: str = "sqlite") -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("django", "djangorestframework", "daphne", "channels", "channels-redis",
                    "pydantic", "psycopg"):  # fmt: skip
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    if database == "postgresql":
        for name, command in (
            ("postgresql", [str(pg_bin_dir() / "postgres"), "--version"]),
            ("redis-server", [shutil.which("redis-server") or "redis-server", "--version"]),
        ):
            with contextlib.suppress(OSError, BenchError):
                versions[name] = subprocess.run(  # noqa: S603
                    command, capture_output=True, text=True, check=False
                ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "packages": versions,
    }


# ---------------------------------------------------------------- the run


def deployment(
    options: argparse.Namespace, work: Path, stack: contextlib.ExitStack
) -> dict[str, str]:
    """The server environment of the chosen mode, its database and Redis started on `stack`."""
    env = server_env(work)
    given = env.get("DATABASE_URL", "")
    if options.database == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
        return env
    # Scale-out: PostgreSQL, and Redis because several web processes only share events
    # through it (docs/deployment.md); a call publishes its events there.
    env["DATABASE_URL"] = (
        given if given.startswith("postgres") else stack.enter_context(postgres_server())
    )
    env["REDIS_URL"] = stack.enter_context(redis_server(work))
    return env


def run(options: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="toolhub-bench-calls-"))
    database = "postgresql" if options.database == "postgres" else "sqlite"
    figures: list[Figure] = []
    raw: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            env = deployment(options, work, stack)
            log(f"state in {work} ({database}{', redis' if 'REDIS_URL' in env else ''})")
            key, connection_id = prepare(env, work / "setup.log")
            upstream_port = free_port()
            upstream_cmd = [sys.executable, "-c", UPSTREAM_CODE, str(upstream_port)]
            upstream = stack.enter_context(process(upstream_cmd, env, work / "upstream.log"))
            wait_for(upstream_port, "/", upstream, "upstream")
            one_daphne(options, env, work, key, connection_id, upstream_port, figures, raw)
            figures.append(per_core(options, env, work, key, raw))
            # The optional rows install from PyPI: when one fails, toolhub's figures still count.
            if options.servers:
                from bench.servers import compare

                try:
                    raw["servers"] = compare(env, work, key, options)
                except (BenchError, OSError, subprocess.SubprocessError) as exc:
                    log(f"the servers' rows failed: {exc}")
                    raw["servers_failed"] = str(exc)
            if options.contextforge:
                try:
                    raw["contextforge"] = contextforge_row(work, upstream_port, options)
                except (BenchError, OSError, subprocess.SubprocessError) as exc:
                    log(f"ContextForge's row failed: {exc}")
                    raw["contextforge"] = {"note": f"ContextForge's row failed: {exc}"}
    finally:
        if not options.keep:
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
    return {"database": database, "figures": figures, "raw": raw}


def one_daphne(
    options: argparse.Namespace,
    env: dict[str, str],
    work: Path,
    key: str,
    connection_id: str,
    upstream_port: int,
    figures: list[Figure],
    raw: dict[str, Any],
) -> None:
    """Goals 1, 2, 3 (one process), 4 and 7 on one Daphne process."""
    port = free_port()
    with process(
        daphne_command(port, usable_cores()[0] if options.pin else None), env, work / "daphne.log"
    ) as daphne:
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
            "healthz": Target("GET", "/healthz"),
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
        figures.append(Figure("1 no-op call: p99 / p50", round(noop_p99 / p50["noop"], 2), "x", 3))
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
            for name in ("bare", "noop", "catalog", "http")
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
        figures.append(memory(port, key, daphne.pid, options.memory_calls, raw))
        raw["load_after"] = load_average()


def memory(port: int, key: str, pid: int, counts: tuple[int, int], raw: dict[str, Any]) -> Figure:
    """Goal 7: Daphne's VmRSS after `short` no-op calls (4 clients), then after `long` in all;
    the calls of the rows before (a few thousand) were made on top of these."""
    short, long = counts
    done = 0
    rss = []
    for target_calls in (short, long):
        each = max(0, target_calls - done) // 4
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(client_noop, [(port, key, each)] * 4))
        done = target_calls
        rss.append(rss_kb(pid))
        log(f"RSS after {target_calls} calls: {rss[-1]} kB ({time.monotonic() - started:.0f} s)")
    raw["rss_kb"] = {str(short): rss[0], str(long): rss[1]}
    return Figure(
        f"7 RSS after {long} calls over RSS after {short}",
        round(100 * (rss[1] / rss[0] - 1), 1),
        "%",
        10,
        detail=f"{rss[0]} kB -> {rss[1]} kB",
    )


_CPU_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu() -> dict[str, int]:
    """The machine's CPU time so far, by kind (/proc/stat's first line, in clock ticks)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return dict(zip(_CPU_KINDS, map(int, fields[1 : 1 + len(_CPU_KINDS)]), strict=True))


def cores_by_kind(before: dict[str, int], after: dict[str, int], cores: int) -> dict[str, float]:
    """How many of the machine's `cores` were busy, idle or waiting on I/O between two
    machine_cpu() readings, on average."""
    spent = {kind: after[kind] - before[kind] for kind in _CPU_KINDS}
    total = sum(spent.values())
    if total <= 0:
        return {"busy": 0.0, "idle": 0.0, "iowait": 0.0}
    idle, iowait = spent["idle"], spent["iowait"]
    return {
        "busy": round(cores * (total - idle - iowait) / total, 2),
        "idle": round(cores * idle / total, 2),
        "iowait": round(cores * iowait / total, 2),
    }


def per_core(
    options: argparse.Namespace, env: dict[str, str], work: Path, key: str, raw: dict[str, Any]
) -> Figure:
    """Goal 3, "with one process per core, throughput grows with the cores": no-op calls
    from the same clients against 1 Daphne process, then one per core, each on a port of
    its own with the clients spread evenly over them, as a load balancer in front of the
    processes would (docs/deployment.md). Read as met when each added process adds at
    least half of the first one's throughput (ratio ≥ 1 + (K - 1) / 2). The clients share
    the cores."""
    cores = options.processes or os.cpu_count() or 1
    name = f"3 {options.clients} clients: no-op throughput, {cores} processes / 1"
    goal = 1 + (cores - 1) / 2
    if cores < 2:
        return Figure(name, None, "x", goal, higher_is_better=True, detail="one core only")
    rows: dict[str, Any] = {}
    noop = Target("POST", "/api/v1/invocations/", {"toolId": NOOP})
    for count in (1, cores):
        with daphne_processes(env, work, count, options.pin) as (ports, procs):
            concurrent(ports, key, noop, options.clients, min(1.0, options.seconds))  # warm-up
            cpu_before = [cpu_seconds(proc.pid) or 0.0 for proc in procs]
            machine_before = machine_cpu()
            row = concurrent(ports, key, noop, options.clients, options.seconds)
            # Where the machine's cores went meanwhile: cores left idle while the clients
            # wait mean the processes were held back by something other than CPU.
            row["machine_cores"] = cores_by_kind(machine_before, machine_cpu(), os.cpu_count() or 1)
            row["cpu_s_per_process"] = [
                round((cpu_seconds(proc.pid) or 0.0) - before, 2)
                for proc, before in zip(procs, cpu_before, strict=True)
            ]
            # What a process serves per second of its own CPU: flat from 1 to K processes
            # when nothing they share (database, locks) holds them back, whatever the
            # clients and the database take of the machine's cores.
            row["cores_per_process"] = [sorted(os.sched_getaffinity(proc.pid)) for proc in procs]
            spent = sum(row["cpu_s_per_process"])
            row["calls_per_cpu_s"] = round(row["requests"] / spent, 1) if spent else None
            rows[str(count)] = row
    raw["per_core"] = rows
    one, many = rows["1"]["per_s"], rows[str(cores)]["per_s"]
    return Figure(
        name,
        round(many / one, 2),
        "x",
        round(goal, 2),
        higher_is_better=True,
        detail=(
            f"{many}/s vs {one}/s; per process: calls {rows[str(cores)]['requests_per_process']},"
            f" CPU s {rows[str(cores)]['cpu_s_per_process']}; calls per CPU second"
            f" {rows[str(cores)]['calls_per_cpu_s']} vs {rows['1']['calls_per_cpu_s']};"
            f" machine idle {rows[str(cores)]['machine_cores']['idle']}"
            f" vs {rows['1']['machine_cores']['idle']} of {os.cpu_count()} cores"
        ),
    )


def client_noop(job: tuple[int, str, int]) -> None:
    port, key, n = job
    client = Client(port, key)
    for _ in range(n):
        client.timed("POST", "/api/v1/invocations/", {"toolId": NOOP})


CONTEXTFORGE = "mcp-contextforge-gateway"


# ContextForge's settings for a local, single-worker, SQLite gateway: strong throwaway
# secrets (it refuses weak ones), no admin UI, and its SSRF guard opened for 127.0.0.1 the
# way toolhub's connection allows the private network.
def contextforge_env(work: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLHUB_", "DATABASE_"))}
    env.pop("REDIS_URL", None)
    env.update(
        {
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "DATABASE_URL": f"sqlite:///{work / 'contextforge.db'}",
            "JWT_SECRET_KEY": secrets.token_urlsafe(40),
            "AUTH_ENCRYPTION_SECRET": secrets.token_urlsafe(40),
            "BASIC_AUTH_PASSWORD": "Bb-" + secrets.token_urlsafe(16),
            "PLATFORM_ADMIN_EMAIL": "admin@example.com",
            "PLATFORM_ADMIN_PASSWORD": "Pa-" + secrets.token_urlsafe(16),
            "DEFAULT_USER_PASSWORD": "Du-" + secrets.token_urlsafe(16),
            "MCPGATEWAY_UI_ENABLED": "false",
            "MCPGATEWAY_ADMIN_API_ENABLED": "false",
            "SSRF_ALLOW_LOCALHOST": "true",
            "SSRF_ALLOW_PRIVATE_NETWORKS": "true",
            "LOG_LEVEL": "ERROR",
        }
    )
    return env


def contextforge_row(work: Path, upstream_port: int, options: argparse.Namespace) -> dict[str, Any]:
    """ContextForge from PyPI in a scratch virtualenv (never a toolhub dependency): started
    with its own CLI (uvicorn, 1 worker) on SQLite, a REST tool registered through its API
    (POST /tools, a JWT made with its create_jwt_token for the platform admin) on the same
    upstream, then invoked through its JSON-RPC endpoint (POST /rpc, tools/call) the way
    toolhub's core__http_request is: sequential samples, then the concurrent clients."""
    home = work / "contextforge"
    home.mkdir()
    venv = home / "venv"
    requirement = CONTEXTFORGE + (
        f"=={options.contextforge}" if options.contextforge != "latest" else ""
    )
    log(f"installing {requirement} in a scratch venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # noqa: S603
    done = subprocess.run(  # noqa: S603
        [str(venv / "bin" / "pip"), "install", "-q", requirement],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode:
        note = "ContextForge could not be installed: " + done.stderr.strip()[-300:]
        log(note)
        return {"installed": False, "note": note}
    python = str(venv / "bin" / "python")
    version = subprocess.run(  # noqa: S603
        [python, "-c", f"import importlib.metadata as m; print(m.version({CONTEXTFORGE!r}))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    port = free_port()
    env = contextforge_env(home, port)
    command = [str(venv / "bin" / "mcpgateway"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]  # fmt: skip
    with process(command, env, home / "contextforge.log", cwd=home) as gateway:
        deadline = time.monotonic() + 180  # the first start creates its schema
        while True:
            if gateway.poll() is not None:
                raise BenchError(f"ContextForge exited:\n{tail(home / 'contextforge.log')}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError(
                    f"ContextForge did not come up:\n{tail(home / 'contextforge.log')}"
                )
            time.sleep(0.5)
        token = (
            subprocess.run(  # noqa: S603
                [
                    python,
                    "-m",
                    "mcpgateway.utils.create_jwt_token",
                    "-u",
                    "admin@example.com",
                    "--exp",
                    "120",
                    "--secret",
                    env["JWT_SECRET_KEY"],
                ],
                cwd=home,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            .stdout.strip()
            .splitlines()
        )
        if not token:
            raise BenchError("ContextForge's create_jwt_token printed no token")
        client = Client(port, token[-1])
        tool = {
            "name": "bench_upstream",
            "url": f"http://127.0.0.1:{upstream_port}/",
            "integration_type": "REST",
            "request_type": "GET",
            "input_schema": {"type": "object", "properties": {}},
        }
        status, body = client.request("POST", "/tools", {"tool": tool})
        if status != 200:
            raise BenchError(f"ContextForge refused the REST tool: {status} {body[:300]!r}")
        name = json.loads(body)["name"]
        call = Target(
            "POST",
            "/rpc",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": name, "arguments": {}},
            },
        )
        status, body = client.request(call.method, call.path, call.body)
        if status != 200 or b'"isError":false' not in body:
            raise BenchError(f"ContextForge's tool call failed: {status} {body[:300]!r}")
        times = sequential(client, {"call": call}, options.warmup + options.calls)["call"]
        times = times[options.warmup :]
        load = concurrent(port, token[-1], call, options.clients, options.seconds)
    row = {
        "installed": True,
        "version": version,
        "p50_ms": round(pct(times, 50), 3),
        "p99_ms": round(pct(times, 99), 3),
        "concurrent": load,
    }
    log(f"ContextForge {version}: p50 {row['p50_ms']} ms, {load['per_s']} calls/s")
    return row


def side_by_side(raw: dict[str, Any], clients: int) -> list[str]:
    """The issue's table: each path's sequential p50, what it adds over the direct upstream
    call, and its throughput with the concurrent clients."""
    seq, load = raw.get("sequential", {}), raw.get("concurrent", {})
    if not seq:
        return []
    direct = seq["direct"]["p50_ms"]
    rows: list[tuple[str, float, str, str]] = []
    forge = raw.get("contextforge") or {}
    if "p50_ms" in forge:
        rows.append(
            (
                f"ContextForge {forge['version']}, REST tool, same upstream (SQLite, 1 worker)",
                forge["p50_ms"],
                f"+{forge['p50_ms'] - direct:.2f} ms",
                f"{forge['concurrent']['per_s']}/s",
            )
        )
    for name, label, added in (
        ("http", f"toolhub {HTTP} on the same upstream", True),
        ("noop", f"toolhub no-op tool ({NOOP})", False),
        ("bare", "toolhub bare endpoint (GET /api/v1/invocations/<id>/)", False),
        ("catalog", "toolhub catalog (GET /api/v1/tools/)", False),
        ("healthz", "toolhub GET /healthz", False),
        ("direct", "the upstream, direct", False),
    ):
        if name in seq:
            rows.append(
                (
                    label,
                    seq[name]["p50_ms"],
                    f"+{seq[name]['p50_ms'] - direct:.2f} ms" if added else "-",
                    f"{load[name]['per_s']}/s" if name in load else "-",
                )
            )
    lines = [f"{'path':<78} {'p50':>9} {'added':>11} {f'{clients} clients':>11}"]
    lines += [f"{a:<78} {b:>6.2f} ms {c:>11} {d:>11}" for a, b, c, d in rows]
    return lines


def report(result: dict[str, Any], options: argparse.Namespace) -> Path:
    figures: list[Figure] = result["figures"]
    raw = result["raw"]
    mode = (
        "PostgreSQL and Redis" if result["database"] == "postgresql" else "SQLite, in-memory layer"
    )
    pinned = ", each pinned to a core of its own" if options.pin else ""
    out(
        f"toolhub call path, {mode}, one Daphne process unless said{pinned}; "
        f"load {raw.get('load_before')} -> {raw.get('load_after')}"
    )
    for figure in sorted(figures, key=lambda f: f.goal.split()[0]):  # by goal, stable
        out(figure.line() + (f"  ({figure.detail})" if figure.detail else ""))
    out()
    for line in side_by_side(raw, options.clients):
        out(line)
    forge = raw.get("contextforge")
    if forge and "p50_ms" not in forge:
        out("ContextForge: " + forge["note"])
    if "servers_failed" in raw:
        out("ASGI servers: not measured: " + raw["servers_failed"])
    if "servers" in raw:
        from bench.servers import table

        out()
        for line in table(raw["servers"], options.clients):
            out(line)
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
        "raw": raw,
        "options": vars(options),
        "code": code_version(),
        "machine": machine(result["database"]),
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    out(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgres"),
        default=None,
        help="sqlite: embedded (default); postgres: scale-out, with its own PostgreSQL "
        "(or DATABASE_URL's) and Redis. Default: postgres when DATABASE_URL is one",
    )
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
    parser.add_argument(
        "--processes", type=int, default=0, help="Daphne processes of the per-core row (nproc)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each Daphne process to a core of its own (taskset -c; the i-th process to "
        "the i-th core this process may use)",
    )
    parser.add_argument("--quick", action="store_true", help="reduced counts (a few minutes)")
    parser.add_argument("--rounds", type=int, default=1, help="--servers: round-robin passes")
    parser.add_argument(
        "--servers",
        action="store_true",
        help="also serve the bare endpoint and /healthz under uvicorn, hypercorn and granian "
        "(pip-installed into a temp dir, never toolhub dependencies)",
    )
    parser.add_argument(
        "--contextforge",
        nargs="?",
        const="1.1.0",
        default=None,
        metavar="VERSION",
        help="add ContextForge's row (pip-installed in a scratch venv; default 1.1.0, "
        "the version of the issue's figures; 'latest' for the newest)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs)")
    parser.add_argument("--output")
    options = parser.parse_args(argv)
    if options.database is None:
        given = os.environ.get("DATABASE_URL", "")
        options.database = "postgres" if given.startswith("postgres") else "sqlite"
    if options.quick:
        options.calls, options.seconds, options.memory_calls = 300, 4, (2_000, 6_000)
    # pg_ctl's server outlives the bench unless the stack unwinds: SIGTERM unwinds it too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        result = run(options)
    except BenchError as exc:
        log(str(exc))
        return 1
    report(result, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
