"""A busy run's stream (issue 47): sustained events to many subscribers over two processes.

    .venv/bin/python bench/stream_lag.py [--rate 200] [--subscribers 100] [--seconds 20]
                                         [--client-procs 4]

Starts a throwaway Redis, two Daphne processes sharing it and one SQLite database (the
scale-out layer, `REDIS_URL`), and opens `--subscribers` streams on one run, half on each
Daphne, spread over `--client-procs` client processes (this script again, `--client`):
one Python process reading every socket was the limit before the server was. A producer
process then emits `--rate` events a second on that run for `--seconds`, through
`apps.invocations.events.emit` (the path every call's events take: numbered, inserted and
committed, then pushed by the process's outbox after commit), one event per commit,
alternating tool_call_start and tool_call_result: each is a layer message of its own (a
call whose tool ran past QUICK_S, the harder case).

Measured, at every subscriber for every event: receipt time minus the event's `at` (taken
before its transaction commits; one machine, one clock) = delivery lag; lost = events a
subscriber never got; duplicates and out-of-order deliveries; streams the server closed
(by code); and CPU seconds used by each process during the run (Daphne x2, Redis, each
client process, this one, which only reads Redis as a feed does: the probe; the producer
while it emitted, without its start), with the calls a second the run carried per CPU
second (two events are one call).

Prints a summary and writes bench/results/stream-lag-<date>-redis.json (`--output`).
Nothing here asserts on timings. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fanout import (
    ROOT,
    BenchError,
    base_env,
    code_version,
    connect,
    cpu_seconds,
    daphne,
    layer_config,
    load_average,
    machine,
    next_result,
    percentile,
    prepare_state,
    raise_nofile,
    redis_server,
    tail,
)

GOAL_RATE = 200
GOAL_SUBSCRIBERS = 100
GOAL_P99_MS = 250.0

# Runs in `manage.py shell -c` with RUN, RATE and SECONDS defined before it: emits events
# on the run at RATE a second for SECONDS from a thread, with this process's event loop
# taking the pushes (as a worker's push loop does), then prints how many it emitted.
PRODUCER_CODE = """
import asyncio, time
from apps.invocations import events
from apps.tenants.models import Tenant

tenant = Tenant.objects.get(slug="bench")

def produce():
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < SECONDS:
        due = int((time.monotonic() - start) * RATE) + 1
        while n < due:
            call = f"call-{n // 2}"
            if n % 2 == 0:
                fields = {"args": {"timezone": "Europe/Paris", "n": n}}
                kind = "tool_call_start"
            else:
                fields = {"ok": True, "result": {"time": "2026-11-29T12:00:00+01:00", "n": n},
                          "durationMs": 3, "invocationId": f"inv-{n // 2}"}
                kind = "tool_call_result"
            events.emit(tenant, RUN, kind, tool_call_id=call, tool_id="core__get_current_time",
                        **fields)
            n += 1
        time.sleep(max(0.0, n / RATE - (time.monotonic() - start)))
    return n, time.monotonic() - start

async def main():
    events.remember_server_loop()
    cpu = time.process_time()
    emitted, took = await asyncio.to_thread(produce)
    box = events.outbox(asyncio.get_running_loop())
    while box.pending or box.missed or (box.sender is not None and not box.sender.done()):
        await asyncio.sleep(0.05)
    cpu = time.process_time() - cpu
    print(f"PRODUCED {emitted} {took:.3f} {box.dropped} {cpu:.3f}", flush=True)

asyncio.run(main())
"""


def run_group(tenant_id: int, run_id: str) -> str:
    """apps.invocations.events.run_group (the bench does not load Django)."""
    digest = hashlib.sha256(f"{tenant_id}/{run_id}".encode()).hexdigest()[:40]
    return f"run.{digest}"


async def probe(
    redis_url: str, group: str, ready: asyncio.Event, arrived: dict[int, float]
) -> None:
    """A member of the run's group in this process, reading as a feed does (in batches):
    when each event could be read from Redis. Beside the subscribers' figures it tells
    the producer's side of the lag (emit, commit, push) from the fan-out's."""
    from toolhub.layers.redis_layer import RedisLayer

    layer = RedisLayer(hosts=[{"address": redis_url, "socket_timeout": None}],
                              capacity=100_000)  # fmt: skip
    channel = await layer.new_channel(prefix="feed")  # the feeds' capacity (settings.py)
    await layer.group_add(group, channel)
    ready.set()
    try:
        while True:
            message = await layer.receive(channel)
            now = time.time()
            for event in message.get("events") or [message.get("event") or {}]:
                if isinstance(event.get("seq"), int):
                    arrived.setdefault(event["seq"], now)
    finally:
        await layer.group_discard(group, channel)


@dataclass
class Stream:
    ws: Any
    process: int  # which Daphne
    seen: list[tuple[int, float]] = field(default_factory=list)  # (seq, received)
    close_code: int | None = None
    control: list[dict[str, Any]] = field(default_factory=list)  # non-event messages


async def read(stream: Stream, at_by_seq: dict[int, str]) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        async for raw in stream.ws:
            received = time.time()
            message = json.loads(raw)
            seq = message.get("seq")
            if not isinstance(seq, int) or "toolCallId" not in message:
                stream.control.append(message)
                continue
            stream.seen.append((seq, received))
            if seq not in at_by_seq:
                at_by_seq[seq] = message["at"]
    except ConnectionClosed:
        pass
    stream.close_code = stream.ws.close_code


async def client(config_path: Path) -> int:
    """One client process (`--client CONFIG`): opens its share of the streams, says READY,
    reads them; told `EMITTED <n> <drain s>` on stdin, waits for event n on every stream
    (or the drain), says DRAINED (the parent reads the CPU clocks then); told REPORT,
    closes its streams and writes what each one received to the config's `output`."""
    config = json.loads(config_path.read_text())
    gate = asyncio.Semaphore(25)
    streams = [
        Stream(await connect(url, config["key"], origin, gate), server)
        for url, origin, server in config["streams"]
    ]
    at_by_seq: dict[int, str] = {}
    readers = [asyncio.ensure_future(read(stream, at_by_seq)) for stream in streams]
    loop = asyncio.get_running_loop()
    gc.collect()
    gc.disable()  # as the single client did: no collector pauses in the measured phase
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    _, emitted_s, drain_s = line.split()
    emitted, deadline = int(emitted_s), time.monotonic() + float(drain_s)
    while time.monotonic() < deadline and not all(
        (s.seen and s.seen[-1][0] >= emitted) or s.close_code is not None for s in streams
    ):
        await asyncio.sleep(0.1)
    sys.stdout.write("DRAINED\n")
    sys.stdout.flush()
    await loop.run_in_executor(None, sys.stdin.readline)
    gc.enable()
    for stream in streams:
        await stream.ws.close()
    await asyncio.gather(*readers, return_exceptions=True)
    report = {
        "at": at_by_seq,
        "streams": [
            {"process": s.process, "seen": s.seen, "close_code": s.close_code,
             "control": s.control}
            for s in streams
        ],
    }  # fmt: skip
    Path(config["output"]).write_text(json.dumps(report))
    return 0


class ClientProcess:
    """A client process as the parent sees it (see `client`)."""

    def __init__(self, index: int, work: Path, streams: list[tuple[str, str, int]], key: str):
        self.index = index
        self.config = work / f"client-{index}.json"
        self.output = work / f"client-{index}-out.json"
        self.log = work / f"client-{index}.log"
        self.config.write_text(
            json.dumps({"key": key, "streams": streams, "output": str(self.output)})
        )
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).resolve()), "--client", str(self.config),
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink,
            )  # fmt: skip

    async def expect(self, word: str, timeout: float) -> None:
        assert self.process is not None and self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"client {self.index} did not say {word}:\n{tail(self.log)}") from None
        if line.decode().strip() != word:
            raise BenchError(f"client {self.index} said {line!r}, not {word}:\n{tail(self.log)}")

    def tell(self, line: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    async def report(self) -> dict[str, Any]:
        assert self.process is not None
        self.tell("REPORT")
        if await asyncio.wait_for(self.process.wait(), 60):
            raise BenchError(f"client {self.index} failed:\n{tail(self.log)}")
        loaded: dict[str, Any] = json.loads(self.output.read_text())
        return loaded

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


def at_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def process_cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def redis_pid(url: str) -> int | None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


async def measure(
    args: argparse.Namespace, env: dict[str, str], key: str, work: Path
) -> dict[str, Any]:
    run_id = f"busy-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(redis_server(work))
        env = {**env, "REDIS_URL": redis_url}
        config = layer_config(env, None)
        servers = [
            stack.enter_context(daphne(env, work / f"daphne-{n}.log", None)) for n in range(2)
        ]
        # Subscriber n is on Daphne n % 2; pairs of them go to the client processes in turn.
        shares: list[list[tuple[str, str, int]]] = [[] for _ in range(args.client_procs)]
        for n in range(args.subscribers):
            server = servers[n % 2]
            url = f"{server.ws_base}/ws/v1/runs/{run_id}/"
            shares[(n // 2) % args.client_procs].append((url, server.base, n % 2))
        clients = [ClientProcess(i, work, share, key) for i, share in enumerate(shares) if share]
        for process in clients:
            stack.callback(process.kill)
        for process in clients:
            await process.start(env)
        for process in clients:
            await process.expect("READY", 180)
        probed: dict[int, float] = {}
        probe_ready = asyncio.Event()
        prober = asyncio.ensure_future(
            probe(redis_url, run_group(args.tenant_id, run_id), probe_ready, probed)
        )
        await asyncio.wait_for(probe_ready.wait(), 30)
        await asyncio.sleep(args.settle)
        pids = {"daphne-0": servers[0].process.pid, "daphne-1": servers[1].process.pid}
        rpid = redis_pid(redis_url)
        if rpid is not None:
            pids["redis"] = rpid
        for process in clients:
            assert process.process is not None
            pids[f"client-{process.index}"] = process.process.pid
        pids["bench"] = os.getpid()  # the probe
        code = f"RUN={run_id!r}\nRATE={args.rate}\nSECONDS={args.seconds}\n" + PRODUCER_CODE
        log_path = work / "producer.log"
        load_before = load_average()
        gc.collect()
        gc.disable()
        started = time.time()
        with log_path.open("ab") as sink:
            producer = subprocess.Popen(  # noqa: S603
                [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=sink,
            )  # fmt: skip
        pids["producer"] = producer.pid
        before = process_cpu(pids)
        while producer.poll() is None:
            await asyncio.sleep(0.2)
        assert producer.stdout is not None
        output = producer.stdout.read().decode()
        line = next((x for x in output.splitlines() if x.startswith("PRODUCED ")), None)
        if producer.returncode or line is None:
            raise BenchError(f"the producer failed:\n{output}\n{tail(log_path)}")
        _, emitted_s, took_s, dropped_s, producer_cpu_s = line.split()
        emitted = int(emitted_s)
        # Each client waits for the last event on its streams (or --drain seconds).
        for process in clients:
            process.tell(f"EMITTED {emitted} {args.drain}")
        for process in clients:
            await process.expect("DRAINED", args.drain + 60)
        after = process_cpu(pids)
        wall = time.time() - started
        gc.enable()
        load_after = load_average()
        prober.cancel()
        reports = [await process.report() for process in clients]

    at_by_seq: dict[int, str] = {}
    streams: list[Stream] = []
    for report in reports:
        at_by_seq.update({int(seq): text for seq, text in report["at"].items()})
        for found in report["streams"]:
            seen = [(int(seq), float(received)) for seq, received in found["seen"]]
            stream = Stream(None, found["process"], seen)
            stream.close_code, stream.control = found["close_code"], found["control"]
            streams.append(stream)
    used = {
        name: (after[name] - before[name])  # type: ignore[operator]
        for name in pids
        if before.get(name) is not None and after.get(name) is not None
    }
    used["producer"] = float(producer_cpu_s)  # while it emitted: not Django's start
    at = {seq: at_seconds(text) for seq, text in at_by_seq.items()}
    lags: list[float] = []
    lost = duplicates = out_of_order = 0
    per_process: dict[int, list[float]] = {0: [], 1: []}
    closed: dict[str, int] = {}
    lagging = 0
    for stream in streams:
        seqs = [seq for seq, _ in stream.seen]
        distinct = set(seqs)
        lost += emitted - len(distinct & set(range(1, emitted + 1)))
        duplicates += len(seqs) - len(distinct)
        out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b < a)
        for seq, received in stream.seen:
            lag = (received - at[seq]) * 1000
            lags.append(lag)
            per_process[stream.process].append(lag)
        if stream.close_code not in (None, 1000):
            closed[str(stream.close_code)] = closed.get(str(stream.close_code), 0) + 1
        lagging += sum(1 for m in stream.control if m.get("type") == "lagging")
    # The lag's course over the run: the p99 of each tenth of the events, in order (a lag
    # that grows means a process could not keep up; a flat one, a fixed cost).
    tenths: list[list[float]] = [[] for _ in range(10)]
    for stream in streams:
        for seq, received in stream.seen:
            tenths[min(9, (seq - 1) * 10 // max(1, emitted))].append((received - at[seq]) * 1000)
    course = []
    for values in tenths:
        values.sort()
        course.append(percentile(values, 99))
    lags.sort()
    to_redis = sorted((probed[seq] - at[seq]) * 1000 for seq in probed if seq in at)
    for values in per_process.values():
        values.sort()
    total_cpu = sum(used.values())
    calls = emitted / 2
    return {
        "run": run_id,
        "subscribers": args.subscribers,
        "client_procs": len(reports),
        "rate_asked": args.rate,
        "seconds": args.seconds,
        "emitted": emitted,
        "producer_s": float(took_s),
        "rate_achieved": round(emitted / float(took_s), 1),
        "outbox_dropped": int(dropped_s),
        "expected_deliveries": emitted * args.subscribers,
        "delivered": sum(len(s.seen) for s in streams),
        "lost": lost,
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "closed_by_server": closed,
        "lagging_events": lagging,
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "max_ms": max(lags) if lags else None,
        "p99_ms_by_process": {str(k): percentile(v, 99) for k, v in per_process.items()},
        "to_redis_p50_ms": percentile(to_redis, 50),
        "to_redis_p99_ms": percentile(to_redis, 99),
        "p99_ms_by_tenth": [None if v is None else round(v, 1) for v in course],
        "cpu_s": {name: round(value, 2) for name, value in used.items()},
        "cpu_s_total": round(total_cpu, 2),
        "wall_s": round(wall, 2),
        "calls_per_cpu_s": round(calls / total_cpu, 1) if total_cpu else None,
        "load_before": load_before,
        "load_after": load_after,
        "layer_config": config,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=GOAL_RATE, help="events a second")
    parser.add_argument("--subscribers", type=int, default=GOAL_SUBSCRIBERS)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long events go")
    parser.add_argument("--settle", type=float, default=1.0, help="pause after subscribing")
    parser.add_argument("--drain", type=float, default=30.0, help="wait for the last event")
    parser.add_argument("--tenant-id", type=int, default=1, help="the bench tenant's pk")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and logs")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--client-procs", type=int, default=4, help="client processes sharing the subscribers"
    )
    parser.add_argument("--client", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_procs < 1:
        parser.error("--client-procs must be at least 1")
    return args


def default_output(now: datetime) -> Path:
    """bench/results/stream-lag-<date>-redis.json, -2, -3... when that day already has one."""
    return next_result(f"stream-lag-{now.date().isoformat()}-redis")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client is not None:
        raise_nofile(args.subscribers + 256)
        return asyncio.run(client(args.client))
    nofile = raise_nofile(args.subscribers + 256)
    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="toolhub-stream-lag-"))
    try:
        env = base_env(work / "var", max(1000, args.subscribers))
        key = prepare_state(env, work / "setup.log")
        result = asyncio.run(measure(args, env, key, work))
    except BenchError as exc:
        sys.stderr.write(f"[stream-lag] failed: {exc}\n")
        return 1
    finally:
        if args.keep:
            sys.stderr.write(f"[stream-lag] kept {work}\n")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    met = (
        result["p99_ms"] is not None
        and result["p99_ms"] <= GOAL_P99_MS
        and result["lost"] == 0
        and result["rate_achieved"] >= 0.95 * GOAL_RATE
        and args.subscribers >= GOAL_SUBSCRIBERS
    )
    for name in ("rate_achieved", "emitted", "delivered", "lost", "duplicates", "out_of_order",
                 "closed_by_server", "lagging_events", "p50_ms", "p99_ms", "max_ms",
                 "p99_ms_by_process", "to_redis_p50_ms", "to_redis_p99_ms",
                 "p99_ms_by_tenth", "cpu_s", "cpu_s_total", "calls_per_cpu_s",
                 "load_before", "load_after"):  # fmt: skip
        sys.stdout.write(f"{name:>18}: {result[name]}\n")
    sys.stdout.write(
        f"goal ({GOAL_RATE} events/s to {GOAL_SUBSCRIBERS} subscribers on two processes, "
        f"p99 <= {GOAL_P99_MS:g} ms, none lost): {'met' if met else 'NOT met'}\n"
    )
    now = datetime.now(UTC)
    path = args.output or default_output(now)
    report = {
        "benchmark": "stream-lag",
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join(["bench/stream_lag.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {**machine(), "nofile": nofile},
        "code": code,
        "goal": {"rate": GOAL_RATE, "subscribers": GOAL_SUBSCRIBERS, "p99_ms": GOAL_P99_MS},
        "goal_met": met,
        "measures": "receipt time at each subscriber minus the event's `at` (set in emit() "
        "before its transaction commits), for every event at every subscriber",
        "result": result,
    }
    path.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
