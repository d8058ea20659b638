"""bench/stream_lag.py's client processes (`--client-procs`): subscribers split over
several processes still receive every event of the run once, in order, and report it
back to the bench. Real Daphne, real WebSocket clients in processes of their own; no
timing is asserted on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from apps.invocations.models import RunEvent
from bench.stream_lag import ClientProcess
from tests.conftest import Agent
from tests.streams.conftest import KeyClient
from tests.support.server import Server

pytestmark = [pytest.mark.server, pytest.mark.one_leg]

RUN = "run-split-clients"
CALLS = 4


async def test_subscribers_split_over_client_processes_get_every_event_once_in_order(
    server: Server, acme: Agent, tmp_path: Path
) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws/v1/runs/{RUN}/"
    shares = [[(url, str(server), 0)] * 2, [(url, str(server), 0)] * 3]
    clients = [ClientProcess(i, tmp_path, share, acme.key) for i, share in enumerate(shares)]
    try:
        for client in clients:
            await client.start(dict(os.environ))
        for client in clients:
            await client.expect("READY", 60)
        caller = KeyClient(server, acme.key)
        for n in range(CALLS):
            await asyncio.to_thread(caller.invoke, "test__echo", args={"text": f"{n}"}, runId=RUN)
        seqs = await sync_to_async(
            lambda: list(RunEvent.objects.filter(run_id=RUN).values_list("seq", flat=True))
        )()
        last = max(seqs)
        assert sorted(seqs) == list(range(1, last + 1)) and last >= CALLS
        for client in clients:
            client.tell(f"EMITTED {last} 30")
        for client in clients:
            await client.expect("DRAINED", 60)
        reports = [await client.report() for client in clients]
    finally:
        for client in clients:
            client.kill()
    streams = [stream for report in reports for stream in report["streams"]]
    assert len(streams) == 5
    for stream in streams:
        assert [seq for seq, _ in stream["seen"]] == list(range(1, last + 1))
        assert stream["close_code"] in (None, 1000)
    for report in reports:
        assert sorted(int(seq) for seq in report["at"]) == list(range(1, last + 1))
