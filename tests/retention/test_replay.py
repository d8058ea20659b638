"""Replays of pruned runs over a real Daphne: /ws/v1/runs/{runId}/?after= answers 4410
when the events after `after` were pruned, and never skips them silently."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed

from apps.invocations.models import InvocationRecord
from apps.retention.models import PruneMark
from tests.console.test_websocket_docs import payload_validator
from tests.retention.support import age, keep_for, prune
from tests.streams.conftest import KeyClient, acme, events, open_ws, server  # noqa: F401
from tests.support.threads import start_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]


def closed_with(base: str, path: str, headers: dict[str, str]) -> tuple[int, list[dict]]:
    """Read a stream until the server closes it: (close code, messages received)."""
    received: list[dict] = []
    with open_ws(base, path, headers) as ws:
        try:
            while True:
                received.append(json.loads(ws.recv(timeout=15)))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, received


def echo_calls(client: KeyClient, run_id: str, n: int) -> list[str]:
    return [
        client.invoke("test__echo", args={"text": f"hi {i}"}, runId=run_id)["invocationId"]
        for i in range(n)
    ]


def test_a_replay_from_a_pruned_seq_is_closed_with_4410_saying_when(server, acme):  # noqa: F811
    client = KeyClient(server, acme.key)
    old = echo_calls(client, "run-p", 2)
    echo_calls(client, "run-p", 1)
    keep_for(acme.tenant, 30)
    age(old, 31)
    prune()
    mark = PruneMark.objects.get()

    for after in (0, 3):
        code, received = closed_with(server, f"/ws/v1/runs/run-p/?after={after}", client.headers)
        assert code == 4410
        assert received == [
            {
                "v": 1,
                "type": "events_pruned",
                "runId": "run-p",
                "throughSeq": 4,
                "prunedAt": mark.pruned_at.isoformat().replace("+00:00", "Z"),
                "prunedBefore": mark.before.isoformat().replace("+00:00", "Z"),
                "detail": f"Events through seq 4 are gone: {mark.describe('calls')} (retention).",
            }
        ]
        assert not list(payload_validator("eventsPruned").iter_errors(received[0]))

    with open_ws(server, "/ws/v1/runs/run-p/?after=4", client.headers) as ws:
        assert [event["seq"] for event in events(ws, 2)] == [5, 6]


def test_a_replay_while_its_run_is_pruned_has_no_gap(server, acme):  # noqa: F811
    client = KeyClient(server, acme.key)
    old = echo_calls(client, "run-big", 70)  # 140 events: more than one replay batch
    echo_calls(client, "run-big", 1)
    keep_for(acme.tenant, 30)
    age(old, 31)
    pruning = start_thread(lambda: prune("--batch", "5"))

    with open_ws(server, "/ws/v1/runs/run-big/?after=0", client.headers) as ws:
        received: list[int] = []
        code = None
        try:
            while not received or received[-1] < 142:
                message = json.loads(ws.recv(timeout=15))
                if message["type"] == "events_pruned":
                    continue  # the 4410 follows
                received.append(message["seq"])
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
    pruning.join(60)

    # Either the whole run, or an unbroken start and then 4410: never a silent gap.
    assert received == list(range(1, len(received) + 1))
    assert received[-1:] == [142] or code == 4410, (received[-3:], code)
    assert InvocationRecord.objects.filter(run_id="run-big").count() == 1
