"""manage.py prune --export: JSON Lines written (and on disk) before anything is deleted."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError

from apps.invocations.models import InvocationRecord, RunEvent
from apps.retention import pruning
from apps.retention.models import PrunedId, PruneMark
from tests.approvals.support import CONFIRM, hold, logged_in, post_decision
from tests.retention.support import age, call, keep_for, prune

pytestmark = pytest.mark.django_db(transaction=True)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_export_holds_one_line_a_call_with_its_events(agent, tmp_path):
    keep_for(agent.tenant, 30)
    old = call(agent, "run-a", 2)
    age(old, 31)
    target = tmp_path / "pruned.jsonl"

    printed = prune("--export", str(target))

    lines = read_lines(target)
    assert [line["record"]["invocationId"] for line in lines] == old
    first = lines[0]
    assert set(first) == {"v", "tenant", "prunedBefore", "record", "events", "approval"}
    assert (first["v"], first["tenant"], first["approval"]) == (1, "acme", None)
    assert first["record"]["status"] == "succeeded"
    assert [event["type"] for event in first["events"]] == ["tool_call_start", "tool_call_result"]
    assert [event["seq"] for event in lines[1]["events"]] == [3, 4]
    assert first["prunedBefore"] == PruneMark.objects.get().before.isoformat().replace(
        "+00:00", "Z"
    )
    assert "acme: exported 2 records" in printed
    assert not InvocationRecord.objects.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["pruned.jsonl"]  # no temporary left


def test_an_approval_is_exported_with_its_votes(caller, operator, tmp_path):
    keep_for(caller.tenant, 30)
    body, approval = hold(caller, CONFIRM, runId="run-held")
    post_decision(logged_in(operator), approval.pk, "reject", reason="not today")
    age([body["invocationId"]], 31)
    target = tmp_path / "pruned.jsonl"

    prune("--export", str(target))

    (line,) = read_lines(target)
    assert line["approval"]["approvalId"] == str(approval.pk)
    assert line["approval"]["status"] == "rejected"
    assert line["approval"]["votes"] == [
        {
            "user": "oscar",
            "decision": "reject",
            "reason": "not today",
            "createdAt": line["approval"]["votes"][0]["createdAt"],
        }
    ]
    assert [event["type"] for event in line["events"]] == [
        "approval_required",
        "approval_decided",
        "tool_call_start",
        "tool_call_result",
    ]


def test_the_export_can_go_to_standard_output(agent, capfd):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 2), 31)

    printed = prune("--export", "-")

    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert [line["record"]["runId"] for line in lines] == ["run-a", "run-a"]
    assert "deleted 2 records" in printed  # progress goes to stderr


def test_a_dry_run_exports_nothing(agent, tmp_path):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 1), 31)

    prune("--dry-run", "--export", str(tmp_path / "x.jsonl"))

    assert list(tmp_path.iterdir()) == []
    assert InvocationRecord.objects.count() == 1


def test_an_export_path_that_cannot_be_written_deletes_nothing(agent, tmp_path):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 2), 31)

    with pytest.raises(CommandError) as refused:
        prune("--export", str(tmp_path / "missing-directory" / "x.jsonl"))

    assert "Cannot write the export" in str(refused.value)
    assert "No such file or directory" in str(refused.value)
    assert "Nothing was deleted" in str(refused.value)
    assert InvocationRecord.objects.count() == 2
    assert RunEvent.objects.count() == 4
    assert not PruneMark.objects.exists()


def test_a_full_device_deletes_nothing(agent):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 2), 31)

    with pytest.raises(CommandError) as refused:
        prune("--export", "/dev/full")

    assert "No space left on device" in str(refused.value)
    assert "This pass deleted nothing. Nothing was deleted." in str(refused.value)
    assert InvocationRecord.objects.count() == 2
    assert RunEvent.objects.count() == 4


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KB tmpfs (root only: skipped where mounting is not allowed)."""
    where = tmp_path / "tiny"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_disk_that_fills_up_during_the_export_deletes_nothing_and_leaves_no_file(
    agent, tiny_disk
):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 40, args={}), 31)

    with pytest.raises(CommandError, match="No space left on device"):
        prune("--export", str(tiny_disk / "pruned.jsonl"))

    assert InvocationRecord.objects.count() == 40
    assert os.listdir(tiny_disk) == []


def test_a_disk_that_fills_up_after_some_passes_keeps_exactly_what_they_deleted(
    agent, tiny_disk, monkeypatch
):
    monkeypatch.setattr(pruning, "PASS_LIMIT", 3)
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 40), 31)
    target = tiny_disk / "pruned.jsonl"

    with pytest.raises(CommandError) as refused:
        prune("--export", str(target))

    assert "No space left on device" in str(refused.value)
    assert f"exported before were deleted and are in {target}" in str(refused.value)
    lines = read_lines(target)  # whole lines only: the failed pass's part was cut off
    assert lines
    pruned = {str(pk) for pk in PrunedId.objects.filter(kind="record").values_list("pk", flat=True)}
    assert {line["record"]["invocationId"] for line in lines} == pruned
    assert InvocationRecord.objects.count() == 40 - len(lines)
    assert os.listdir(tiny_disk) == ["pruned.jsonl"]
