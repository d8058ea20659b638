"""Where the machine's cores went during the per-core row (bench/calls.py `machine_cpu`,
`cores_by_kind`): read from /proc/stat, split into busy, idle and waiting on I/O."""

from __future__ import annotations

from bench.calls import cores_by_kind, machine_cpu

KINDS = {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}


def test_the_machine_cpu_is_read_by_kind_and_only_grows() -> None:
    first = machine_cpu()
    sum(i * i for i in range(200_000))  # some CPU between the readings
    second = machine_cpu()
    assert set(first) == KINDS
    assert all(isinstance(value, int) and value >= 0 for value in first.values())
    assert all(second[kind] >= first[kind] for kind in KINDS)


def test_the_time_between_two_readings_is_split_over_the_cores() -> None:
    before = dict.fromkeys(KINDS, 1000)
    after = {**before, "user": 1300, "system": 1100, "softirq": 1050, "idle": 1450, "iowait": 1100}
    # 1,000 ticks in all: 450 busy, 450 idle, 100 waiting on I/O, over two cores.
    assert cores_by_kind(before, after, 2) == {"busy": 0.9, "idle": 0.9, "iowait": 0.2}


def test_no_time_between_two_readings_is_no_share() -> None:
    same = dict.fromkeys(KINDS, 5)
    assert cores_by_kind(same, same, 2) == {"busy": 0.0, "idle": 0.0, "iowait": 0.0}
