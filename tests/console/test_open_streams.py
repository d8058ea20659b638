"""toolhub_open_streams counts accepted run and approval streams, and forgets closed ones."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from apps.approvals.consumers import ApprovalsConsumer
from toolhub.asgi import application
from toolhub.ops.metrics import open_streams

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_approvals_stream_is_counted_while_it_is_open(operator: User):
    before = open_streams.snapshot().get("approvals", 0)
    stream = WebsocketCommunicator(ApprovalsConsumer.as_asgi(), "/ws/v1/approvals/")
    stream.scope["user"] = operator
    connected, _ = await stream.connect()
    assert connected

    assert open_streams.snapshot()["approvals"] == before + 1
    await stream.disconnect()
    assert open_streams.snapshot()["approvals"] == before


async def test_a_run_stream_is_counted_and_a_refused_one_is_not(caller):
    before = open_streams.snapshot().get("runs", 0)
    refused = WebsocketCommunicator(application, "/ws/v1/runs/r-1/")
    await refused.connect()
    assert await refused.receive_output() == {"type": "websocket.close", "code": 4403}
    assert open_streams.snapshot().get("runs", 0) == before
    await refused.disconnect()
    assert open_streams.snapshot().get("runs", 0) == before

    stream = WebsocketCommunicator(
        application,
        "/ws/v1/runs/r-1/",
        headers=[(b"authorization", f"Bearer {caller.key}".encode())],
    )
    connected, _ = await stream.connect()
    assert connected
    assert open_streams.snapshot()["runs"] == before + 1
    await stream.disconnect()
    assert open_streams.snapshot()["runs"] == before
