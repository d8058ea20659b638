"""A run stream replays a long run from after=0 in batches of REPLAY_BATCH events (issue
45): never the whole run in one read, so its memory does not grow with the run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from apps.invocations import consumers
from apps.invocations.consumers import RunConsumer
from apps.invocations.models import RunEvent
from toolhub.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = 250


def write_run(tenant_id: int) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    RunEvent.objects.bulk_create(
        RunEvent(
            tenant_id=tenant_id,
            run_id="long",
            seq=seq,
            type="tool_call_start",
            tool_call_id=f"call-{seq}",
            tool_id="test__echo",
            message={"type": "tool_call_start", "seq": seq, "runId": "long"},
            at=at,
        )
        for seq in range(1, EVENTS + 1)
    )


async def test_a_replay_from_the_start_reads_the_run_a_batch_at_a_time(acme, monkeypatch):
    await database_sync_to_async(write_run)(acme.tenant.pk)
    batches: list[int] = []
    read = RunConsumer.__dict__["_events_after"]  # database_sync_to_async binds on access

    async def counted(self: RunConsumer, seq: int) -> Any:
        events = await read.__get__(self, RunConsumer)(seq)
        batches.append(len(events))
        return events

    monkeypatch.setattr(RunConsumer, "_events_after", counted)
    stream = WebsocketCommunicator(
        application,
        "/ws/v1/runs/long/?after=0",
        headers=[(b"authorization", f"Bearer {acme.key}".encode())],
    )
    connected, _ = await stream.connect()
    assert connected
    seqs = [(await stream.receive_json_from(timeout=10))["seq"] for _ in range(EVENTS)]
    await stream.disconnect()

    assert seqs == list(range(1, EVENTS + 1))
    full, rest = divmod(EVENTS, consumers.REPLAY_BATCH)
    assert batches == [consumers.REPLAY_BATCH] * full + [rest]
