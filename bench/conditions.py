"""Rules with a bounded cost (RULES_HAVE_A_BOUNDED_COST): does the most expensive rule a
tenant can save slow the other tenants down?

    .venv/bin/python bench/conditions.py                          # 3 rounds, 10 s a phase
    .venv/bin/python bench/conditions.py --rounds 1 --seconds 3   # a quick check
    .venv/bin/python bench/conditions.py --rate 50                # tenant a: 50 calls a second
    .venv/bin/python bench/conditions.py --limit 8000             # a rule under another limit

The CEL library holds Python's lock for a whole evaluation, so a costly rule stalls every
request of the process (apps/policies/cost.py). This bench:

1. finds, for each kind of costly condition (nested comprehensions over literals, map()
   and filter() over a literal, exists_one(), patterns that are slow to compile), the
   largest one the cost check still accepts, times each in this process, and keeps the
   slowest: the most expensive rule a tenant admin can save;
2. builds throwaway state (SQLite in a temp dir, as calls.py does): tenant `b`, and three
   tenants whose agents call the same tool under a deny rule that never matches:
   `a-trivial` (`false`), `a-capped` (the rule of step 1, saved through `full_clean`, as
   the admin saves it) and `a-over-cap` (the security review's five nested
   comprehensions, written to the database without the check, as a rule saved before it);
3. starts Daphne as deployed (calls.py's command, not in debug mode) and runs phases in
   rounds, interleaved so drift hits them alike: `idle` (tenant b alone), then each `a-*`
   tenant calling `core__get_current_time` back to back from a process of its own while
   tenant b's probe alternates its own call and `GET /healthz` on keep-alive connections.

It reports tenant b's call and /healthz p50 and p99 per phase, and whether `a-capped`'s
p99 is within 10 % of the idle run's (and of the `a-trivial` run's, which has the same
load without the rule's cost). Writes bench/results/conditions-<date>.json (or
--output). Nothing here asserts on timings.
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
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from apps.policies import conditions, cost  # noqa: E402  (after the path is set)
from bench.calls import (  # noqa: E402
    NOOP,
    RESULTS_DIR,
    BenchError,
    Client,
    code_version,
    daphne_command,
    free_port,
    load_average,
    machine,
    out,
    pct,
    process,
    server_env,
    wait_for,
)
from bench.fanout import cpu_seconds, tail  # noqa: E402

TWENTY = "[" + ",".join(str(i) for i in range(20)) + "]"
PHASES = ("idle", "a-trivial", "a-capped", "a-over-cap")


def log(message: str) -> None:
    sys.stderr.write(f"[conditions] {message}\n")
    sys.stderr.flush()


def literal(items: int) -> str:
    return "[" + ",".join(str(i % 10) for i in range(items)) + "]"


def nested(levels: int, over: str) -> str:
    condition = "false"
    for level in reversed(range(levels)):
        condition = f"{over}.exists(v{level}, {condition})"
    return condition


# Each kind of costly condition, by size; all of them are false (a deny rule that never
# matches, so every call is evaluated and then runs).
KINDS: dict[str, Callable[[int], str]] = {
    "three nested exists() over a literal": lambda n: nested(3, literal(n)),
    "two nested exists() over a literal": lambda n: nested(2, literal(n)),
    "exists_one() over a literal": lambda n: f"{literal(n)}.exists_one(x, x < 0)",
    "filter() over a literal": lambda n: f"size({literal(n)}.filter(x, true)) < 0",
    "map() over a literal": lambda n: f"size({literal(n)}.map(x, x)) < 0",
    "a pattern of n dots": lambda n: f'"x".matches(".{{{n}}}")',
    "a pattern of n non-digits": lambda n: f'"x".matches("\\\\D{{{n}}}")',
    "a pattern of n negated classes": lambda n: f'"x".matches("[^a]{{{n}}}")',
    "a pattern of n ASCII classes": lambda n: f'"x".matches("[a-z]{{{n}}}")',
    "a pattern of Unicode word classes": lambda n: '"x".matches("' + "\\\\w" * n + '")',
}

SETUP_CODE = """
import json
from guardian.shortcuts import assign_perm
from apps.policies.models import Policy, PolicyRule
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool

tool = Tool.objects.get(pk=TOOL)
keys = {}
for slug, condition, checked in RULES:
    tenant = Tenant.objects.create(slug=slug, name=slug)
    _, keys[slug] = ApiKey.objects.issue(tenant, "agent:bench", name="rule-cost benchmark")
    policy = Policy.objects.create(tenant=tenant, name="bench")
    policy.tools.add(tool)
    assign_perm("tools.execute_tool", agents_group(tenant), tool)
    if condition is not None:
        rule = PolicyRule(policy=policy, tool_pattern=tool.pk, condition=condition, outcome="deny")
        if checked:
            rule.full_clean()  # as the admin saves it: the cost check runs
        rule.save()
print("BENCH_KEYS=" + json.dumps(keys))
"""

# Tenant a's agent: calls on one keep-alive connection, back to back or `rate` a second,
# until told to stop (SIGTERM); then prints how many calls it made, how many were denied,
# and their times.
LOOP_CODE = """
import http.client, json, signal, sys, time
port, key, tool, rate = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
body = json.dumps({"toolId": tool, "args": {}}).encode()
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
running = True
def finish(signum, frame):
    global running
    running = False
signal.signal(signal.SIGTERM, finish)
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
times, denied = [], 0
next_at = time.perf_counter()
while running:
    if rate:
        next_at += 1 / rate
        time.sleep(max(0.0, next_at - time.perf_counter()))
    started = time.perf_counter()
    conn.request("POST", "/api/v1/invocations/", body=body, headers=headers)
    payload = conn.getresponse().read()
    times.append((time.perf_counter() - started) * 1000)
    denied += b'"policy_denied"' in payload
print(json.dumps({"calls": len(times), "denied": denied, "times_ms": times}))
"""


# ---------------------------------------------------------------- the costliest rule


def largest_accepted(kind: Callable[[int], str]) -> tuple[int, str] | None:
    """The largest size whose condition the cost check accepts (sizes are monotone)."""
    low, high = 0, 2048
    while low < high:
        middle = (low + high + 1) // 2
        try:
            conditions.compile_condition(kind(middle))
        except conditions.ConditionError:
            high = middle - 1
        else:
            low = middle
    return (low, kind(low)) if low else None


def evaluation_times_us(condition: str, samples: int) -> list[float]:
    conditions.holds(condition, {})
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        conditions.holds(condition, {})
        times.append((time.perf_counter() - started) * 1e6)
    return sorted(times)


def costliest(samples: int) -> tuple[str, list[dict[str, Any]]]:
    """The slowest of the largest accepted condition of each kind, and every kind's row."""
    rows: list[dict[str, Any]] = []
    slowest, slowest_p50 = "", -1.0
    for name, kind in KINDS.items():
        found = largest_accepted(kind)
        if found is None:
            continue
        size, condition = found
        times = evaluation_times_us(condition, samples)
        model = conditions.compile_condition(condition).cost.worst()
        p50 = statistics.median(times)
        rows.append(
            {
                "kind": name,
                "size": size,
                "characters": len(condition),
                "model_steps": round(model),
                "model_us": round(model * cost.STEP_US),
                "p50_us": round(p50),
                "p99_us": round(pct(times, 99)),
                "condition": condition if len(condition) < 200 else condition[:200] + "...",
            }
        )
        log(f"{name}: size {size}, model {model * cost.STEP_US:,.0f} µs, p50 {p50:,.0f} µs")
        if p50 > slowest_p50:
            slowest, slowest_p50 = condition, p50
    return slowest, rows


# ---------------------------------------------------------------- the run


def prepare(env: dict[str, str], work: Path, capped: str) -> dict[str, str]:
    manage = [sys.executable, str(ROOT / "manage.py")]
    with (work / "setup.log").open("ab") as sink:
        done = subprocess.run(  # noqa: S603
            [*manage, "migrate", "--noinput"], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    if done.returncode:
        raise BenchError(f"manage.py migrate failed:\n{tail(work / 'setup.log')}")
    rules = [
        ("b", None, True),
        ("a-trivial", "false", True),
        ("a-capped", capped, True),
        ("a-over-cap", nested(5, TWENTY), False),
    ]
    code = SETUP_CODE.replace("TOOL", repr(NOOP)).replace("RULES", repr(rules))
    shell = subprocess.run(  # noqa: S603
        [*manage, "shell", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    for line in shell.stdout.splitlines():
        if line.startswith("BENCH_KEYS="):
            keys: dict[str, str] = json.loads(line.split("=", 1)[1])
            return keys
    raise BenchError(f"setup failed:\n{shell.stdout}\n{shell.stderr}")


def probe(port: int, key: str, seconds: float) -> dict[str, list[float]]:
    """Tenant b: its call, then /healthz, back to back, each on its keep-alive connection."""
    caller, health = Client(port, key), Client(port)
    body = {"toolId": NOOP, "args": {}}
    times: dict[str, list[float]] = {"call": [], "healthz": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        times["call"].append(caller.timed("POST", "/api/v1/invocations/", body))
        times["healthz"].append(health.timed("GET", "/healthz"))
    return times


def phase(
    name: str, port: int, keys: dict[str, str], daphne_pid: int, options: argparse.Namespace
) -> dict[str, Any]:
    loop = None
    if name != "idle":
        loop = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", LOOP_CODE, str(port), keys[name], NOOP, str(options.rate)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(options.warmup)
    cpu_before, load = cpu_seconds(daphne_pid), load_average()
    times = probe(port, keys["b"], options.seconds)
    cpu_after = cpu_seconds(daphne_pid)
    result: dict[str, Any] = {"phase": name, "load": load, "probe_ms": times}
    if cpu_before is not None and cpu_after is not None:
        result["daphne_cpu_s"] = round(cpu_after - cpu_before, 3)
    if loop is not None:
        loop.send_signal(signal.SIGTERM)
        output, _ = loop.communicate(timeout=60)
        result["a"] = json.loads(output.strip().splitlines()[-1])
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for name in PHASES:
        mine = [run for run in runs if run["phase"] == name]
        row: dict[str, Any] = {"rounds": len(mine)}
        for what in ("call", "healthz"):
            values = [t for run in mine for t in run["probe_ms"][what]]
            row[what] = {
                "samples": len(values),
                "p50_ms": round(statistics.median(values), 3),
                "p99_ms": round(pct(values, 99), 3),
                "max_ms": round(max(values), 3),
            }
        if name != "idle":
            a_times = [t for run in mine for t in run["a"]["times_ms"]]
            row["a"] = {
                "calls": len(a_times),
                "denied": sum(run["a"]["denied"] for run in mine),
                "p50_ms": round(statistics.median(a_times), 3),
                "p99_ms": round(pct(a_times, 99), 3),
            }
        rows[name] = row
    return rows


def verdicts(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for what in ("call", "healthz"):
        capped = rows["a-capped"][what]["p99_ms"]
        for against in ("idle", "a-trivial"):
            ratio = capped / rows[against][what]["p99_ms"]
            found[f"{what}_p99_capped_over_{against}"] = round(ratio, 3)
            found[f"{what}_within_10_percent_of_{against}"] = ratio <= 1.10
    return found


def run(options: argparse.Namespace) -> dict[str, Any]:
    if options.limit is not None:
        cost.LIMIT = options.limit
    log(f"finding the most expensive rule under {cost.LIMIT:,} steps")
    capped, kinds = costliest(options.samples)
    work = Path(tempfile.mkdtemp(prefix="toolhub-bench-conditions-"))
    try:
        env = server_env(work)
        env["DATABASE_URL"] = f"sqlite:///{work / 'toolhub.sqlite3'}"
        keys = prepare(env, work, capped)
        port = free_port()
        with process(daphne_command(port), env, work / "daphne.log") as daphne:
            wait_for(port, "/healthz", daphne, "daphne")
            Client(port, keys["b"]).timed("POST", "/api/v1/invocations/", {"toolId": NOOP})
            load_before = load_average()
            runs = []
            for round_number in range(options.rounds):
                for name in PHASES:
                    log(f"round {round_number + 1}/{options.rounds}: {name}")
                    runs.append(phase(name, port, keys, daphne.pid, options))
            load_after = load_average()
    finally:
        if options.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    rows = summary(runs)
    return {
        "capped_rule": capped,
        "capped_rule_model_steps": round(conditions.compile_condition(capped).cost.worst()),
        "kinds": kinds,
        "rows": rows,
        "verdicts": verdicts(rows),
        "load_before": load_before,
        "load_after": load_after,
        "runs": [
            {key: value for key, value in r.items() if key not in ("probe_ms", "a")} for r in runs
        ],
        "limits": {
            "steps": cost.LIMIT,
            "step_us": cost.STEP_US,
            "per_value": cost.PER_VALUE_LIMIT,
            "per_char": cost.PER_CHAR_LIMIT,
        },
    }


def report(result: dict[str, Any], options: argparse.Namespace) -> Path:
    out(f"most expensive rule accepted ({result['capped_rule_model_steps']:,} steps by the model):")
    out(f"  {result['capped_rule'][:160]}{'...' if len(result['capped_rule']) > 160 else ''}")
    out("costliest accepted condition of each kind, evaluated in this process:")
    for row in result["kinds"]:
        out(
            f"  {row['kind']:38} size {row['size']:5}  model {row['model_us']:6,} µs  "
            f"p50 {row['p50_us']:6,} µs  p99 {row['p99_us']:6,} µs"
        )
    out(f"tenant b's probe, ms (load {result['load_before']} -> {result['load_after']}):")
    out(f"  {'phase':12} {'call p50':>9} {'call p99':>9} {'/healthz p50':>13} {'p99':>7}  a")
    for name, row in result["rows"].items():
        a = row.get("a")
        a_text = f"{a['calls']} calls, p50 {a['p50_ms']:.2f} ms, {a['denied']} denied" if a else ""
        out(
            f"  {name:12} {row['call']['p50_ms']:9.2f} {row['call']['p99_ms']:9.2f} "
            f"{row['healthz']['p50_ms']:13.2f} {row['healthz']['p99_ms']:7.2f}  {a_text}"
        )
    for key, value in result["verdicts"].items():
        out(f"  {key}: {value}")
    RESULTS_DIR.mkdir(exist_ok=True)
    path = Path(options.output) if options.output else default_output()
    payload = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **result,
        "options": vars(options),
        "code": code_version(),
        "machine": machine(),
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    out(f"wrote {path}")
    return path


def default_output() -> Path:
    """bench/results/conditions-<date>.json, or -2, -3... when that day already has one."""
    day = datetime.now(UTC).date().isoformat()
    path = RESULTS_DIR / f"conditions-{day}.json"
    index = 2
    while path.exists():
        path = RESULTS_DIR / f"conditions-{day}-{index}.json"
        index += 1
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over the phases")
    parser.add_argument("--seconds", type=float, default=10, help="tenant b's probe, per phase")
    parser.add_argument("--warmup", type=float, default=1, help="tenant a's calls before it")
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="tenant a's calls a second (default 0: back to back, as fast as answered)",
    )
    parser.add_argument("--samples", type=int, default=300, help="in-process evaluations per kind")
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"look for the costliest rule under this many steps rather than cost.LIMIT "
        f"({cost.LIMIT:,}): how the figures move with the limit (the server keeps its own)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs)")
    parser.add_argument("--output")
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        result = run(options)
    except BenchError as exc:
        log(str(exc))
        return 1
    report(result, options)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
