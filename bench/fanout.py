"""Event fan-out benchmark: one run's events delivered to N WebSocket subscribers.

    .venv/bin/python bench/fanout.py [--subscribers 100,1000] [--layers memory,redis] [--events 20]

For every (layer, N) it starts a fresh Daphne serving toolhub against throwaway
state, opens N subscribers on /ws/v1/runs/<run>/ with an API key, then makes E
calls to core__get_current_time on that run, one at a time. For every
tool_call_result event it records, at every subscriber, receipt time minus the
event's `at` (taken by `emit` before its transaction commits, so the figure is
commit-to-receipt plus the commit itself: slightly pessimistic). Each call waits
until every subscriber has its result (or --timeout) and then --gap seconds, so
calls never overlap.

A reference follows in the same run: a bare channel-layer group_send to N
channels of the same layer type, received in this process (no Django, no
WebSocket, no JSON), measuring send-to-receive.

Prints a table and writes it as JSON to bench/results/fanout-<date>.json.
Nothing here asserts on timings: it reports them. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import hashlib
import itertools
import json
import os
import platform
import pstats
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
VENV_BIN = Path(sys.executable).parent
TOOL_ID = "core__get_current_time"
# Prints toolhub's channel-layer CONFIG for the environment it runs in; the references
# are built with the same settings (capacity, expiry...) as the server.
LAYER_CONFIG_CODE = (
    "import json, toolhub.settings as s; "
    "print(json.dumps(s.CHANNEL_LAYERS['default'].get('CONFIG', {})))"
)
GOAL_SUBSCRIBERS = 1000
GOAL_P99_MS = 100.0
REDIS_HINT = (
    "redis-server is needed for --layers redis: install it (Debian/Ubuntu: "
    "`sudo apt-get install redis-server`) or run with --layers memory"
)

# Runs inside `manage.py shell -c`: the tenant, its key and a policy like tests/conftest.py's
# allow(): the tool listed, and execute_tool on it for the tenant's agents group.
SETUP_CODE = f"""
from guardian.shortcuts import assign_perm
from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool

tenant = Tenant.objects.create(slug="bench", name="Bench")
_, raw = ApiKey.objects.issue(tenant, "agent:bench", name="fan-out benchmark")
policy = Policy.objects.create(tenant=tenant, name="bench")
tool = Tool.objects.get(pk="{TOOL_ID}")
policy.tools.add(tool)
assign_perm("tools.execute_tool", agents_group(tenant), tool)
print("BENCH_KEY=" + raw)
"""


class BenchError(RuntimeError):
    pass


def log(message: str) -> None:
    sys.stderr.write(f"[fanout] {message}\n")
    sys.stderr.flush()


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raise_nofile(needed: int) -> int:
    """Lift the soft open-files limit to the hard one; children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        log(f"warning: RLIMIT_NOFILE is {soft}, below the ~{needed} this run needs")
    return int(soft)


def stop(process: subprocess.Popen[bytes] | None, name: str) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        log(f"{name} (pid {process.pid}) ignored SIGTERM; killing it")
        process.kill()
        process.wait()


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def base_env(var_dir: Path, ws_max: int) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "TOOLHUB_EXTRA_TOOL_MODULES"}
    }
    env.update(
        {
            "TOOLHUB_VAR_DIR": str(var_dir),
            # Not debug mode: DEBUG records every query; generated secrets instead.
            "TOOLHUB_DEBUG": "0",
            "TOOLHUB_SECRET_KEY": secrets.token_urlsafe(50),
            "TOOLHUB_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "TOOLHUB_WS_MAX_PER_PRINCIPAL": str(ws_max),
            "TOOLHUB_EMBEDDED_WORKER": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def layer_config(env: dict[str, str], redis_url: str | None) -> dict[str, Any]:
    """toolhub's CHANNEL_LAYERS config, read from its settings under the bench's env."""
    env = {**env, "REDIS_URL": redis_url} if redis_url else env
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", LAYER_CONFIG_CODE], cwd=ROOT, env=env, capture_output=True
    )
    if done.returncode:
        raise BenchError(f"could not read the channel-layer settings:\n{done.stderr.decode()}")
    config: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    config.pop("hosts", None)
    return config


def code_version() -> dict[str, Any]:
    """The commit measured, and any uncommitted changes to the application code."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(  # noqa: S603
                ["git", *args],  # noqa: S607
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout

    paths = ("--", "apps", "toolhub", "pyproject.toml")
    dirty = git("status", "--porcelain", *paths)
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": [line[3:] for line in dirty.splitlines() if line.strip()],
        "diff_sha256": hashlib.sha256(git("diff", "HEAD", *paths).encode()).hexdigest()[:16],
    }


def prepare_state(env: dict[str, str], log_path: Path) -> str:
    """Migrate a fresh SQLite database and create the tenant, key and policy; returns the key."""
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
    for line in shell.stdout.splitlines():
        if line.startswith("BENCH_KEY="):
            return line.removeprefix("BENCH_KEY=").strip()
    raise BenchError(f"setup failed:\n{shell.stdout}\n{shell.stderr}")


@contextlib.contextmanager
def redis_server(work_dir: Path) -> Iterator[str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise BenchError(REDIS_HINT)
    port = free_port()
    log_path = work_dir / "redis.log"
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(work_dir)]  # fmt: skip
    with log_path.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink)  # noqa: S603
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                raise BenchError(
                    f"redis-server exited with {process.returncode}:\n{tail(log_path)}"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError("redis-server did not answer PING within 15 s")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(process, "redis-server")


@dataclass
class Server:
    base: str
    ws_base: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def daphne(env: dict[str, str], log_path: Path, profile: Path | None) -> Iterator[Server]:
    port = free_port()
    command = [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port),
               "toolhub.asgi:application"]  # fmt: skip
    if profile is not None:
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), *command]
    with log_path.open("ab") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)  # noqa: S603
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise BenchError(f"daphne exited with {process.returncode}:\n{tail(log_path)}")
            try:
                with _opener.open(f"{base}/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"daphne did not come up within 60 s:\n{tail(log_path)}")
            time.sleep(0.2)
        yield Server(base=base, ws_base=f"ws://127.0.0.1:{port}", process=process)
    finally:
        stop(process, "daphne")


# Local calls must not go through any proxy configured in the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def invoke(base: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(  # noqa: S310  (always http://127.0.0.1)
        f"{base}/api/v1/invocations/",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _opener.open(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"detail": exc.read().decode(errors="replace")[:500]}


# ---------------------------------------------------------------- measuring


class Arrivals:
    """Counts deliveries per message key; lets the sender wait until all N arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.counts: dict[str, int] = {}
        self.events: dict[str, asyncio.Event] = {}
        self.sample: dict[str, Any] | None = None  # one message as received
        self.finished = False  # set before the bench closes its own connections

    def _event(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    def arrived(self, key: str) -> None:
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        if count >= self.expected:
            self._event(key).set()

    def gone(self) -> None:
        """A subscriber was closed by the server: stop waiting for it."""
        self.expected -= 1
        for key, event in self.events.items():
            if self.counts.get(key, 0) >= self.expected:
                event.set()

    async def wait(self, key: str, timeout: float) -> bool:
        if self.counts.get(key, 0) >= self.expected:
            return True
        try:
            await asyncio.wait_for(self._event(key).wait(), timeout)
        except TimeoutError:
            return False
        return True


@dataclass
class Result:
    system: str  # "toolhub" (end to end) or "bare" (channel layer alone)
    layer: str
    subscribers: int
    events: int
    expected: int
    received: int
    lost: int
    duplicates: int = 0
    out_of_order: int = 0
    failed_connections: int = 0
    # Subscribers the server closed during the run, by close code (1011: server error).
    closed_by_server: dict[str, int] = field(default_factory=dict)
    # Results lost on subscribers that stayed open to the end.
    lost_on_open: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    # tool_call_start, toolhub only: its `at` is the call's start (before the invocation
    # record is written), and it is fanned out alone; each result queues behind its start.
    start_p50_ms: float | None = None
    start_p99_ms: float | None = None
    # Per event: the fastest subscriber (the fixed cost before fan-out) and the slowest.
    first_subscriber_p50_ms: float | None = None
    last_subscriber_p50_ms: float | None = None
    last_subscriber_max_ms: float | None = None
    connect_s: float | None = None
    # The POST's round trip: the request thread waits for each event's group_send.
    call_p50_ms: float | None = None
    call_max_ms: float | None = None
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    wall_s: float | None = None
    # 1-minute load average before and after the measured phase: other work on the
    # machine competes for the same cores and shows up directly in the latencies.
    load_before: float | None = None
    load_after: float | None = None
    # The layer's CONFIG (from toolhub's settings), used by the server and the reference.
    layer_config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not values:
        return None
    rank = max(1, -(-len(values) * pct // 100))
    return values[min(len(values), int(rank)) - 1]


def fill_latencies(
    result: Result,
    latencies_s: list[float],
    per_event_first_s: list[float],
    per_event_last_s: list[float],
) -> None:
    ms = sorted(value * 1000 for value in latencies_s)
    result.p50_ms = percentile(ms, 50)
    result.p99_ms = percentile(ms, 99)
    result.max_ms = ms[-1] if ms else None
    result.mean_ms = sum(ms) / len(ms) if ms else None
    result.first_subscriber_p50_ms = percentile(sorted(v * 1000 for v in per_event_first_s), 50)
    last = sorted(value * 1000 for value in per_event_last_s)
    result.last_subscriber_p50_ms = percentile(last, 50)
    result.last_subscriber_max_ms = last[-1] if last else None


@dataclass
class Subscriber:
    ws: Any
    # (seq, type, toolCallId, at, received) per message, in arrival order.
    seen: list[tuple[int, str, str, str, float]] = field(default_factory=list)
    close_code: int | None = None
    closed_at: float | None = None  # when the server closed it, if it did before the end


async def read(subscriber: Subscriber, arrivals: Arrivals) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        async for raw in subscriber.ws:
            received = time.time()  # first thing: the client's own work is not counted after it
            event = json.loads(raw)
            subscriber.seen.append(
                (int(event["seq"]), event["type"], event["toolCallId"], event["at"], received)
            )
            if event["type"] == "tool_call_result":
                arrivals.arrived(event["toolCallId"])
                if arrivals.sample is None:
                    arrivals.sample = event
    except ConnectionClosed:
        pass
    subscriber.close_code = subscriber.ws.close_code
    if not arrivals.finished:
        subscriber.closed_at = time.time()
        arrivals.gone()


async def connect(url: str, key: str, origin: str, gate: asyncio.Semaphore) -> Any:
    from websockets.asyncio.client import connect as ws_connect
    from websockets.typing import Origin

    async with gate:
        return await ws_connect(
            url,
            origin=Origin(origin),  # same-origin, as a browser page would send
            additional_headers={"Authorization": f"Bearer {key}"},
            compression=None,
            proxy=None,
            ping_interval=None,
            max_queue=None,
            open_timeout=120,
            close_timeout=5,
        )


@dataclass
class Options:
    events: int
    gap: float
    timeout: float
    settle: float
    connect_concurrency: int
    client_gc: bool = False


@contextlib.contextmanager
def measuring(opts: Options) -> Iterator[None]:
    """The measured phase, with this process's garbage collector paused (unless --client-gc).

    This one process plays all N subscribers. With 1,000 connections and the receipts it
    keeps, its own collector paused it for 12 to 28 ms about once a second (a full
    collection: 45 ms), stalling every simulated subscriber at once, and those pauses were
    counted as the server's latency. A real subscriber is a process of its own. So the
    bench collects once and pauses its collector while it measures; the server's is left
    alone. The figures of 2026-11-26 and before were taken with it running.
    """
    if opts.client_gc:
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def run_toolhub(
    server: Server, key: str, layer: str, n: int, opts: Options
) -> tuple[Result, dict[str, Any] | None]:
    """N subscribers on one run, E calls on it; returns the result and a sample event."""
    run_id = f"bench-{layer}-{n}-{uuid.uuid4().hex[:8]}"
    # Warm the HTTP path (URL resolver, serializers, DB connection) on another run.
    status, payload = await asyncio.to_thread(
        invoke, server.base, key, {"toolId": TOOL_ID, "args": {}, "runId": run_id + "-warm"}
    )
    if status != 200:
        raise BenchError(f"warm-up call failed: {status} {payload}")

    url = f"{server.ws_base}/ws/v1/runs/{run_id}/"
    gate = asyncio.Semaphore(opts.connect_concurrency)
    started = time.perf_counter()
    opened = await asyncio.gather(
        *(connect(url, key, server.base, gate) for _ in range(n)), return_exceptions=True
    )
    connect_s = time.perf_counter() - started
    failures = [item for item in opened if isinstance(item, BaseException)]
    subscribers = [Subscriber(ws=item) for item in opened if not isinstance(item, BaseException)]
    notes = []
    if failures:
        notes.append(f"{len(failures)} subscribers could not connect: {failures[0]!r}")
        log(notes[-1])
    log(f"toolhub/{layer}: {len(subscribers)} subscribers connected in {connect_s:.1f} s")
    arrivals = Arrivals(len(subscribers))
    readers = [asyncio.create_task(read(s, arrivals)) for s in subscribers]
    await asyncio.sleep(opts.settle)  # each consumer joins the group just after accepting

    call_ids = [f"call-{index:04d}" for index in range(1, opts.events + 1)]
    load_before = load_average()
    server_cpu = cpu_seconds(server.process.pid)
    client_cpu = time.process_time()
    wall = time.perf_counter()
    call_ms: list[float] = []
    with measuring(opts):
        for call_id in call_ids:
            body = {"toolId": TOOL_ID, "args": {}, "runId": run_id, "toolCallId": call_id}
            posted = time.perf_counter()
            status, payload = await asyncio.to_thread(invoke, server.base, key, body)
            call_ms.append((time.perf_counter() - posted) * 1000)
            if status != 200 or payload.get("ok") is not True:
                raise BenchError(f"{call_id}: {status} {payload}")
            if not await arrivals.wait(call_id, opts.timeout):
                got = arrivals.counts.get(call_id, 0)
                notes.append(f"{call_id}: {got}/{len(subscribers)} had it after {opts.timeout:g} s")
                log(notes[-1])
            await asyncio.sleep(opts.gap)
        await asyncio.sleep(1.0)  # stragglers and duplicates
    wall_s = time.perf_counter() - wall - opts.gap * len(call_ids) - 1.0
    server_cpu_after = cpu_seconds(server.process.pid)
    client_cpu_s = time.process_time() - client_cpu

    arrivals.finished = True
    await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)

    result = Result(
        system="toolhub",
        layer=layer,
        subscribers=n,
        events=opts.events,
        expected=n * opts.events,
        received=0,
        lost=0,
        failed_connections=len(failures),
        connect_s=round(connect_s, 2),
        call_p50_ms=percentile(sorted(call_ms), 50),
        call_max_ms=max(call_ms),
        server_cpu_s=(
            round(server_cpu_after - server_cpu, 2)
            if server_cpu is not None and server_cpu_after is not None
            else None
        ),
        client_cpu_s=round(client_cpu_s, 2),
        wall_s=round(wall_s, 2),
        load_before=load_before,
        load_after=load_average(),
        notes=notes,
    )
    wanted = set(call_ids)
    at_cache: dict[str, float] = {}
    latencies: list[float] = []
    start_latencies: list[float] = []
    per_event_last: dict[str, float] = {}
    per_event_first: dict[str, float] = {}
    for subscriber in subscribers:
        seqs = [seq for seq, *_ in subscriber.seen]
        result.out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        delivered: set[str] = set()
        for _seq, kind, call_id, at, received in subscriber.seen:
            if call_id not in wanted:
                continue
            if at not in at_cache:
                at_cache[at] = datetime.fromisoformat(at).timestamp()
            if kind == "tool_call_start":
                start_latencies.append(received - at_cache[at])
            if kind != "tool_call_result":
                continue
            if call_id in delivered:
                result.duplicates += 1
                continue
            delivered.add(call_id)
            latency = received - at_cache[at]
            latencies.append(latency)
            per_event_last[call_id] = max(per_event_last.get(call_id, 0.0), latency)
            per_event_first[call_id] = min(per_event_first.get(call_id, latency), latency)
        result.received += len(delivered)
        if subscriber.closed_at is not None:
            code = str(subscriber.close_code)
            result.closed_by_server[code] = result.closed_by_server.get(code, 0) + 1
        else:
            result.lost_on_open += len(wanted - delivered)
    if result.closed_by_server:
        closed = sum(result.closed_by_server.values())
        notes.append(f"the server closed {closed} subscribers mid-run: {result.closed_by_server}")
        log(notes[-1])
    result.lost = result.expected - result.received
    fill_latencies(result, latencies, [*per_event_first.values()], [*per_event_last.values()])
    start_ms = sorted(value * 1000 for value in start_latencies)
    result.start_p50_ms = percentile(start_ms, 50)
    result.start_p99_ms = percentile(start_ms, 99)
    return result, arrivals.sample


async def run_bare(
    layer: str,
    n: int,
    redis_url: str | None,
    config: dict[str, Any],
    event: dict[str, Any],
    opts: Options,
) -> Result:
    """group_send to N channels of one layer, each received by its own task in this process."""
    layer_obj: Any
    if layer == "memory":
        from channels.layers import InMemoryChannelLayer

        layer_obj = InMemoryChannelLayer(**config)
    else:
        from channels_redis.core import RedisChannelLayer

        layer_obj = RedisChannelLayer(hosts=[redis_url], **config)
    group = f"bench.{uuid.uuid4().hex[:24]}"
    names = [await layer_obj.new_channel() for _ in range(n)]
    for name in names:
        await layer_obj.group_add(group, name)
    arrivals = Arrivals(n)
    seen: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]

    async def receive(index: int, name: str) -> None:
        while True:
            message = await layer_obj.receive(name)
            received = time.time()
            seq = int(message["event"]["seq"])
            seen[index].append((seq, float(message["sentAt"]), received))
            arrivals.arrived(str(seq))

    receivers = [asyncio.create_task(receive(i, name)) for i, name in enumerate(names)]
    await asyncio.sleep(opts.settle)
    notes = []
    load_before = load_average()
    client_cpu = time.process_time()
    wall = time.perf_counter()
    with measuring(opts):
        for seq in range(1, opts.events + 1):
            message = {"type": "run.event", "sentAt": time.time(), "event": {**event, "seq": seq}}
            await layer_obj.group_send(group, message)
            if not await arrivals.wait(str(seq), opts.timeout):
                got = arrivals.counts.get(str(seq), 0)
                notes.append(f"message {seq}: {got}/{n} had it after {opts.timeout:g} s")
                log(notes[-1])
            await asyncio.sleep(opts.gap)
        await asyncio.sleep(1.0)
    wall_s = time.perf_counter() - wall - opts.gap * opts.events - 1.0
    client_cpu_s = time.process_time() - client_cpu
    for receiver in receivers:
        receiver.cancel()
    await asyncio.gather(*receivers, return_exceptions=True)
    if layer != "memory":
        await layer_obj.flush()
        await layer_obj.close_pools()

    result = Result(
        system="bare",
        layer=layer,
        subscribers=n,
        events=opts.events,
        expected=n * opts.events,
        received=0,
        lost=0,
        client_cpu_s=round(client_cpu_s, 2),
        wall_s=round(wall_s, 2),
        load_before=load_before,
        load_after=load_average(),
        notes=notes,
    )
    latencies: list[float] = []
    per_event_last: dict[int, float] = {}
    per_event_first: dict[int, float] = {}
    for messages in seen:
        seqs = [seq for seq, _, _ in messages]
        result.out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        delivered_seqs: set[int] = set()
        for seq, sent, received in messages:
            if seq in delivered_seqs:
                result.duplicates += 1
                continue
            delivered_seqs.add(seq)
            latencies.append(received - sent)
            per_event_last[seq] = max(per_event_last.get(seq, 0.0), received - sent)
            per_event_first[seq] = min(per_event_first.get(seq, received - sent), received - sent)
        result.received += len(delivered_seqs)
    result.lost = result.expected - result.received
    fill_latencies(result, latencies, [*per_event_first.values()], [*per_event_last.values()])
    return result


# A tool_call_result as toolhub sends it, for the reference's payload (replaced by a real
# one when the toolhub run received any).
SAMPLE_EVENT: dict[str, Any] = {
    "v": 1,
    "seq": 0,
    "type": "tool_call_result",
    "runId": "bench-run",
    "toolCallId": "call-0001",
    "toolId": TOOL_ID,
    "at": "2026-01-01T00:00:00.000000Z",
    "ok": True,
    "durationMs": 1,
    "invocationId": str(uuid.UUID(int=0)),
    "result": {"iso": "2026-01-01T00:00:00+00:00", "timezone": "UTC", "unix": 1767225600.0},
}


# ---------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("django", "channels", "channels-redis", "daphne", "twisted", "autobahn",
                    "websockets", "redis"):  # fmt: skip
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    redis_bin = shutil.which("redis-server")
    if redis_bin:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            versions["redis-server"] = subprocess.run(  # noqa: S603
                [redis_bin, "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[Result]) -> list[str]:
    head = (
        f"{'system':<8} {'layer':<7} {'N':>6} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'lost':>7} {'closed':>7} {'load':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.system:<8} {r.layer:<7} {r.subscribers:>6} {fmt(r.p50_ms):>9} "
            f"{fmt(r.p99_ms):>9} {fmt(r.max_ms):>9} {r.lost:>7} "
            f"{sum(r.closed_by_server.values()):>7} {fmt(r.load_before):>5}"
        )
    return lines


def goal_verdicts(results: list[Result]) -> dict[str, bool | None]:
    verdicts: dict[str, bool | None] = {}
    for r in results:
        if r.system == "toolhub" and r.subscribers == GOAL_SUBSCRIBERS:
            verdicts[r.layer] = (
                r.p99_ms is not None
                and r.p99_ms <= GOAL_P99_MS
                and r.lost == 0
                and r.duplicates == 0
            )
    return verdicts


def next_result(name: str) -> Path:
    """bench/results/<name>.json, or <name>-2.json, -3... when that one exists."""
    path, index = RESULTS_DIR / f"{name}.json", 2
    while path.exists():
        path, index = RESULTS_DIR / f"{name}-{index}.json", index + 1
    return path


def default_output(now: datetime) -> Path:
    """bench/results/fanout-<date>.json, or -2, -3... when that day already has one."""
    return next_result(f"fanout-{now.date().isoformat()}")


def summarise_profile(profile: Path) -> Path:
    text = profile.with_suffix(".txt")
    with text.open("w") as sink:
        stats = pstats.Stats(str(profile), stream=sink)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)
    return text


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--subscribers", default="100,1000", help="comma-separated N values")
    parser.add_argument("--layers", default="memory,redis", help="memory, redis or both")
    parser.add_argument("--events", type=int, default=20, help="calls (results) per run")
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between calls")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-event wait, seconds")
    parser.add_argument("--settle", type=float, default=1.0, help="pause after subscribing")
    parser.add_argument("--connect-concurrency", type=int, default=25)
    parser.add_argument("--no-reference", action="store_true", help="skip the bare layer runs")
    parser.add_argument(
        "--client-gc",
        action="store_true",
        help="leave the bench's own garbage collector running while it measures (as before "
        "2026-11-26): its pauses stall all N simulated subscribers at once",
    )
    parser.add_argument(
        "--redis-url-query",
        default="",
        help="appended to REDIS_URL as ?<query> for both toolhub and the reference, "
        "e.g. socket_timeout=30 (default: REDIS_URL exactly as a deployment would set it)",
    )
    parser.add_argument("--output", type=Path, help="JSON path (default bench/results/...)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs)")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="run Daphne under cProfile and write <layer>-<N>.prof/.txt here "
        "(profiling slows the server: use for attribution, not for figures)",
    )
    args = parser.parse_args(argv)
    args.subscriber_counts = [int(x) for x in args.subscribers.split(",") if x.strip()]
    args.layer_names = [x.strip() for x in args.layers.split(",") if x.strip()]
    unknown = set(args.layer_names) - {"memory", "redis"}
    if unknown or not args.layer_names:
        parser.error(f"--layers takes memory and/or redis, not {sorted(unknown)}")
    if not args.subscriber_counts or min(args.subscriber_counts) < 1 or args.events < 1:
        parser.error("--subscribers and --events must be positive")
    return args


async def bench_layer(
    layer: str,
    counts: list[int],
    env: dict[str, str],
    key: str,
    work: Path,
    opts: Options,
    args: argparse.Namespace,
) -> list[Result]:
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        redis_url = None
        if layer == "redis":
            redis_url = stack.enter_context(redis_server(work))
            if args.redis_url_query:
                redis_url += "?" + args.redis_url_query
            env = {**env, "REDIS_URL": redis_url}
        config = layer_config(env, None)
        for n in counts:
            profile = None
            if args.profile_dir is not None:
                args.profile_dir.mkdir(parents=True, exist_ok=True)
                profile = args.profile_dir.resolve() / f"{layer}-{n}.prof"
            log(f"toolhub/{layer}: N={n}, {opts.events} calls")
            with daphne(env, work / f"daphne-{layer}-{n}.log", profile) as server:
                result, sample = await run_toolhub(server, key, layer, n, opts)
            result.layer_config = config
            results.append(result)
            log(f"toolhub/{layer}/{n}: p99 {fmt(result.p99_ms)} ms, lost {result.lost}")
            if profile is not None and profile.exists():
                log(f"profile: {summarise_profile(profile)}")
            if args.no_reference:
                continue
            event = sample or SAMPLE_EVENT
            log(f"bare/{layer}: N={n}")
            bare = await run_bare(layer, n, redis_url, config, event, opts)
            bare.layer_config = config
            results.append(bare)
            log(f"bare/{layer}/{n}: p99 {fmt(bare.p99_ms)} ms, lost {bare.lost}")
    return results


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop processes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if "redis" in args.layer_names and not (
        shutil.which("redis-server") or Path("/usr/bin/redis-server").exists()
    ):
        log(REDIS_HINT)
        return 2
    most = max(args.subscriber_counts)
    nofile = raise_nofile(most + 256)
    load_at_start = load_average()
    code = code_version()
    if load_at_start is not None and load_at_start > (os.cpu_count() or 1) / 2:
        log(f"warning: load average is {load_at_start}: other work will inflate the figures")
    opts = Options(
        events=args.events,
        gap=args.gap,
        timeout=args.timeout,
        settle=args.settle,
        connect_concurrency=args.connect_concurrency,
        client_gc=args.client_gc,
    )
    work = Path(tempfile.mkdtemp(prefix="toolhub-fanout-"))
    results: list[Result] = []
    try:
        env = base_env(work / "var", max(5000, most))
        log(f"state in {work}: migrating and creating a tenant, key and policy")
        key = prepare_state(env, work / "setup.log")
        for layer in args.layer_names:
            results += asyncio.run(
                bench_layer(layer, args.subscriber_counts, env, key, work, opts, args)
            )
    except BenchError as exc:
        log(f"failed: {exc}")
        return 1
    finally:
        if args.keep:
            log(f"kept {work} (daphne-*.log, redis.log, setup.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)

    if code_version() != code:
        code["changed_during_run"] = True
        log("warning: the application code changed while the benchmark ran")
    out()
    for line in table(results):
        out(line)
    verdicts = goal_verdicts(results)
    out()
    for layer, met in verdicts.items():
        out(
            f"goal (p99 <= {GOAL_P99_MS:g} ms at {GOAL_SUBSCRIBERS} subscribers, none lost), "
            f"{layer}: {'met' if met else 'NOT met'}"
        )
    for r in results:
        for note in r.notes:
            out(f"note {r.system}/{r.layer}/{r.subscribers}: {note}")

    now = datetime.now(UTC)
    path = args.output or default_output(now)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "fanout",
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join(["bench/fanout.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {**machine(), "nofile": nofile, "load_at_start": load_at_start},
        "code": code,
        "parameters": {
            "subscribers": args.subscriber_counts,
            "layers": args.layer_names,
            "events": args.events,
            "gap_s": args.gap,
            "timeout_s": args.timeout,
            "tool": TOOL_ID,
            "redis_url_query": args.redis_url_query,
            "profiled": args.profile_dir is not None,
            "client_gc": args.client_gc,
        },
        "measures": {
            "toolhub": "receipt time at the subscriber minus the tool_call_result event's `at` "
            "(set in emit() before its transaction commits)",
            "bare": "receipt time minus the time just before channel_layer.group_send",
        },
        "goal": {"subscribers": GOAL_SUBSCRIBERS, "p99_ms": GOAL_P99_MS, "lost": 0},
        "goal_met": verdicts,
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(report, indent=2) + "\n")
    out(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
