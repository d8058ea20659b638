"""The call-path bench (bench/calls.py) runs end to end on a tiny load and reports every
goal of issue 13. It proves the bench works, not that the goals hold: figures from a
test run on a busy machine mean nothing, so none is asserted on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOALS = [
    "1 no-op call: p50 added over the bare endpoint",
    "1 no-op call: p99 / p50",
    "2 core__http_request: p50 added over direct + bare",
    "3 3 clients: no-op throughput / bare",
    "3 3 clients: catalog throughput / bare",
    "3 3 clients: no-op p99 / p50",
    "3 3 clients: no-op throughput, 2 processes / 1",
    "4 5 concurrent 1 s calls: wall time",
    "5 argument validation, 10-field schema: p50",
    "7 RSS after 20 calls over RSS after 10",
]


def run_bench(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """A bench script with this interpreter; its own throwaway state, never the suite's
    database. Fails with the end of its stderr."""
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.server
def test_it_runs_the_call_bench_on_a_tiny_load_and_prints_every_goal(tmp_path: Path) -> None:
    output = tmp_path / "calls.json"
    # The suite's PostgreSQL pass runs the bench's scale-out mode (its own PostgreSQL server
    # and Redis, never the suite's database); the SQLite pass runs the embedded mode.
    scale_out = os.environ.get("DATABASE_URL", "").startswith("postgres")
    tiny = [
        "--calls",
        "5",
        "--warmup",
        "2",
        "--clients",
        "3",
        "--seconds",
        "0.5",
        "--sleepers",
        "5",
        "--validations",
        "50",
        "--memory-calls",
        "10,20",
        "--processes",  # one per core, whatever this machine has
        "2",
        "--database",
        "postgres" if scale_out else "sqlite",
        *(["--pin"] if scale_out else []),  # as deployed: one process per core
    ]
    done = run_bench(["bench/calls.py", *tiny, "--output", str(output)], timeout=120)
    lines = done.stdout.splitlines()
    mode = "PostgreSQL and Redis" if scale_out else "SQLite, in-memory layer"
    assert lines[0].startswith(f"toolhub call path, {mode},"), lines[0]
    assert ("each pinned to a core of its own" in lines[0]) is scale_out
    for goal in GOALS:
        (line,) = [line for line in lines if line.startswith(goal)]
        assert " MET" in line, line  # MET or NOT MET, with a measured value
        assert "n/a" not in line
    assert "toolhub no-op tool (core__get_current_time)" in done.stdout  # the side-by-side table
    saved = json.loads(output.read_text())
    assert saved["database"] == ("postgresql" if scale_out else "sqlite")
    assert sorted(figure["goal"] for figure in saved["figures"]) == sorted(GOALS)
    assert all(figure["value"] is not None for figure in saved["figures"])
    per_core = saved["raw"]["per_core"]
    assert sorted(per_core) == ["1", "2"]
    assert len(per_core["2"]["cpu_s_per_process"]) == 2
    # The clients are spread evenly: each process served calls.
    served = per_core["2"]["requests_per_process"]
    assert len(served) == 2 and min(served) > 0
    assert per_core["2"]["calls_per_cpu_s"] > 0
    # Where the cores went: busy, idle and waiting on I/O add up to the machine's cores.
    split = per_core["2"]["machine_cores"]
    assert sorted(split) == ["busy", "idle", "iowait"]
    assert sum(split.values()) == pytest.approx(os.cpu_count(), abs=0.05)
    cores = per_core["2"]["cores_per_process"]
    mine = sorted(os.sched_getaffinity(0))
    if scale_out:  # pinned: the i-th process on the i-th core this one may use
        assert cores == [[mine[0]], [mine[1 % len(mine)]]]
    else:
        assert cores == [mine, mine]


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="scale-out only: run in the suite's PostgreSQL pass",
)
def test_it_runs_the_queue_bench_on_a_tiny_load(tmp_path: Path) -> None:
    """bench/decision.py --throughput: its own PostgreSQL server and Redis (never the
    suite's database) and two workers. Every call must end with exactly one result; the
    rate is not asserted on."""
    output = tmp_path / "queue.json"
    command = ["bench/decision.py", "--throughput", "30", "--workers", "2", "--output"]
    run_bench([*command, str(output)], timeout=180)
    (row,) = json.loads(output.read_text())["results"]
    assert row["records"] == row["final"] == row["succeeded"] == 30
    assert row["calls_with_one_result"] == row["calls_with_results"] == 30
    assert row["entries_not_successful"] == 0
    assert row["calls_per_second"] > 0
    # The bench fails when it cannot find its Redis; 30 calls may take Redis under one
    # clock tick of CPU, so its figure may be 0.
    assert set(row["cpu_ms_per_call"]) == {"workers", "postgresql", "redis"}
    assert all(value >= 0 for value in row["cpu_ms_per_call"].values())
