"""Pruning while calls are made, records are read and an export is written."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord, RunEvent
from apps.retention.models import PrunedId
from tests.retention.support import CLOCK, age, call, keep_for, prune
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)


def test_calls_made_and_records_read_while_pruning_with_an_export_all_stay_whole(
    agent, tmp_path: Path
):
    keep_for(agent.tenant, 30)
    old = call(agent, "run-a", 30) + call(agent, "run-b", 10)
    age(old, 31)
    stop = threading.Event()
    made: list[str] = []
    answers: list[int] = []
    failures: list[BaseException] = []

    def caller() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        try:
            while not stop.is_set():
                # The same run as the old calls: its new events follow the pruned prefix.
                response = client.post(
                    "/api/v1/invocations/", {"toolId": CLOCK, "runId": "run-a"}, format="json"
                )
                assert response.status_code == 200, response.content
                made.append(response.json()["invocationId"])
        except BaseException as exc:
            failures.append(exc)

    def reader() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        try:
            while not stop.is_set():
                for pk in old[::5]:
                    answers.append(client.get(f"/api/v1/invocations/{pk}/").status_code)
        except BaseException as exc:
            failures.append(exc)

    threads = [start_thread(caller), start_thread(reader)]
    target = tmp_path / "pruned.jsonl"
    try:
        prune("--export", str(target), "--batch", "3")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)

    assert not failures, failures
    assert made, "no call was made while pruning"
    assert set(answers) <= {200, 410}, answers
    exported = [json.loads(line) for line in target.read_text().splitlines()]
    # Everything pruned was exported first, each call once, with both of its events.
    assert sorted(line["record"]["invocationId"] for line in exported) == sorted(old)
    assert {str(pk) for pk in PrunedId.objects.values_list("pk", flat=True)} == set(old)
    assert all(len(line["events"]) == 2 for line in exported)
    # The calls made meanwhile are whole: records finished, two events each, and the
    # run's remaining events are one unbroken run of numbers.
    assert InvocationRecord.objects.filter(pk__in=made, status="succeeded").count() == len(made)
    remaining = list(
        RunEvent.objects.filter(tenant=agent.tenant, run_id="run-a")
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert len(remaining) == 2 * len(made)
    assert remaining == list(range(61, 61 + len(remaining)))


def test_two_pruners_at_once_delete_each_call_once(agent):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 20), 31)
    printed: list[str] = []
    failures: list[BaseException] = []

    def pruner() -> None:
        try:
            printed.append(prune("--batch", "2"))
        except BaseException as exc:
            failures.append(exc)

    threads = [start_thread(pruner) for _ in range(2)]
    for thread in threads:
        thread.join(60)

    assert not failures, failures
    assert not InvocationRecord.objects.exists()
    assert PrunedId.objects.count() == 20
