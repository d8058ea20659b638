"""Clean restarts on a real Daphne (toolhub/server/draining.py, toolhub/server/daphne_frames.py).

On SIGTERM every open stream gets a close frame with 4012 and a reason saying to
reconnect elsewhere (clients used to see 1006, as after a network failure), a stream
opened meanwhile is closed the same way, the requests in flight finish, `/healthz` stays
200 and `/readyz` answers 503. And a stream the server fails is closed with 4011 on the
wire: its 1011 was refused by Daphne ("invalid close code 1011", a traceback, no frame).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import allow, make_agent
from tests.streams.conftest import ws_url
from tests.support.server import daphne, free_port, invoke
from toolhub.server.draining import CLOSE_RESTARTING, RESTART_REASON

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

STREAMS = 500  # the fault: SIGTERM with 500 open streams


def probe(base: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError as error:  # no answer: the assertions show it with the server's log
        return 0, repr(error)


async def open_streams(base: str, headers: dict[str, str], count: int) -> list[ClientConnection]:
    url = ws_url(base, "/ws/v1/runs/run-restart/")
    opening = [
        connect(url, additional_headers=headers, open_timeout=60, close_timeout=10)
        for _ in range(count)
    ]
    return list(await asyncio.gather(*opening))


async def how_it_closed(stream: ClientConnection) -> tuple[int, str] | None:
    """The close frame the server sent (None: the connection ended without one, 1006)."""
    await asyncio.wait_for(stream.wait_closed(), 30)
    received = stream.protocol.close_rcvd
    return None if received is None else (received.code, received.reason)


def test_sigterm_closes_every_stream_with_4012_and_drains(test_tools: list[str], tmp_path: Path):
    agent = make_agent("restarts")
    allow(agent.tenant, "test__counted_wait")
    headers = {"Authorization": f"Bearer {agent.key}"}
    trace = tmp_path / "trace"
    trace.touch()

    async def scenario(server: Any) -> dict[str, Any]:
        streams = await open_streams(server, headers, STREAMS)
        in_flight = asyncio.ensure_future(
            asyncio.to_thread(
                invoke,
                server,
                agent.key,
                {
                    "toolId": "test__counted_wait",
                    "args": {"path": str(trace), "token": "in-flight", "ms": 3000},
                },
            )
        )
        while "in-flight" not in trace.read_text():  # the call is in its tool
            await asyncio.sleep(0.02)
        os.kill(server.pid, signal.SIGTERM)
        # The stop has begun once a stream got its close frame. (A request sent as
        # SIGTERM lands can be cancelled by Daphne before it runs, unanswered.)
        await asyncio.wait_for(streams[0].wait_closed(), 10)
        ready = await asyncio.to_thread(probe, server, "/readyz")
        healthz = await asyncio.to_thread(probe, server, "/healthz")
        late = await connect(ws_url(server, "/ws/v1/runs/run-late/"), additional_headers=headers)
        closes = await asyncio.gather(*(how_it_closed(s) for s in [*streams, late]))
        return {"ready": ready, "healthz": healthz, "closes": closes, "call": await in_flight}

    with daphne({"TOOLHUB_WS_MAX_PER_PRINCIPAL": "1000"}) as server:
        seen = asyncio.run(scenario(server))
        assert server.process.wait(timeout=30) == 0, server.output()[-3000:]
        log = server.output()

    assert seen["ready"] == (503, {"status": "draining", "checks": {}}), log[-3000:]
    assert seen["healthz"] == (200, {"status": "ok"})
    closes = seen["closes"]
    # Every stream, and the one opened while the server stopped.
    assert closes == [(CLOSE_RESTARTING, RESTART_REASON)] * (STREAMS + 1), closes
    status, body, _ = seen["call"]
    assert (status, body["result"]) == (200, {"token": "in-flight", "executions": 1}), body
    assert "Traceback" not in log, log[-3000:]


def test_a_stream_the_server_fails_closes_with_4011_not_1011(test_tools: list[str]):
    """Redis unreachable: the run stream cannot subscribe and is closed as failed. Daphne
    refused the 1011 it was closed with; 4011 reaches the client."""
    agent = make_agent("no-redis")
    headers = {"Authorization": f"Bearer {agent.key}"}

    async def opened(server: str) -> tuple[int, str] | None:
        stream = await connect(ws_url(server, "/ws/v1/runs/run-x/"), additional_headers=headers)
        return await how_it_closed(stream)

    with daphne({"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}) as server:
        closed = asyncio.run(opened(server))
        log = server.output()
    assert closed is not None and closed[0] == 4011, (closed, log[-3000:])
    assert "invalid close code" not in log, log[-3000:]
