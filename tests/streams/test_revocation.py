"""Revoking an API key ends its open streams (4403) and voids its unused tickets."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from websockets.exceptions import ConnectionClosed

from apps.invocations import revocations
from apps.invocations.revocations import REVOCATIONS_GROUP, key_watch
from apps.tenants.models import ApiKey
from tests.conftest import make_agent
from tests.streams.conftest import KeyClient, open_ws, refusal
from toolhub.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]


def revoke(agent) -> None:
    ApiKey.objects.get(prefix=agent.key.split("_")[1]).revoke()


def closed_within(ws, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            break
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
    return None


@pytest.mark.server
def test_revoking_a_key_closes_its_open_stream_with_4403_within_seconds(server, acme):
    """Revoked here, in the test process: Daphne does not get the push, so this is the
    periodic re-check."""
    other = make_agent("acme", "agent:other")  # another key of the tenant: its stream stays
    with (
        open_ws(server, "/ws/v1/runs/rv-1/", {"Authorization": f"Bearer {acme.key}"}) as ws,
        open_ws(server, "/ws/v1/runs/rv-1/", {"Authorization": f"Bearer {other.key}"}) as kept,
    ):
        revoke(acme)
        assert closed_within(ws, revocations.RECHECK_S + 5) == 4403
        assert closed_within(kept, 0.5) is None
    assert "Traceback" not in server.output()


@pytest.mark.server
def test_a_ticket_issued_before_the_revocation_no_longer_opens_a_stream(server, acme):
    client = KeyClient(server, acme.key)
    status, body = client.ticket("rv-2")
    assert status == 201
    _, spare = client.ticket("rv-2")
    revoke(acme)
    assert refusal(server, f"/ws/v1/runs/rv-2/?ticket={body['ticket']}") == 4403
    # Every unused ticket of the key is void, not only the first one tried.
    assert refusal(server, f"/ws/v1/runs/rv-2/?ticket={spare['ticket']}") == 4403


@pytest.mark.server
def test_a_ticket_of_a_key_that_is_still_active_opens_a_stream(server, acme):
    status, body = KeyClient(server, acme.key).ticket("rv-3")
    assert status == 201
    assert refusal(server, f"/ws/v1/runs/rv-3/?ticket={body['ticket']}", wait=0.5) == "open"


async def test_the_revocation_push_closes_the_stream_before_any_re_check(acme):
    layer = get_channel_layer()
    await layer.flush()
    stream = WebsocketCommunicator(
        application,
        "/ws/v1/runs/rv-push/",
        headers=[(b"authorization", f"Bearer {acme.key}".encode())],
    )
    connected, _ = await stream.connect()
    assert connected
    assert len(layer.groups.get(REVOCATIONS_GROUP, {})) == 1  # one listener per process
    await database_sync_to_async(revoke)(acme)
    # Well before RECHECK_S: the push, not the re-check, closed it.
    closing = await stream.receive_output(timeout=revocations.RECHECK_S / 2)
    assert closing == {"type": "websocket.close", "code": 4403}
    await stream.disconnect()
    assert not key_watch().streams
    assert not layer.groups.get(REVOCATIONS_GROUP)  # the last stream gone, so is the listener


async def test_a_stream_opened_with_a_ticket_ends_when_the_tickets_key_is_revoked(acme):
    from apps.invocations.models import StreamTicket

    key = await database_sync_to_async(ApiKey.objects.get)(prefix=acme.key.split("_")[1])
    _, raw = await database_sync_to_async(StreamTicket.objects.issue)(
        acme.tenant, acme.principal, key.user_id, "rv-ticket", api_key=key
    )
    stream = WebsocketCommunicator(application, f"/ws/v1/runs/rv-ticket/?ticket={raw}")
    connected, _ = await stream.connect()
    assert connected
    await database_sync_to_async(key.revoke)()
    closing = await stream.receive_output(timeout=revocations.RECHECK_S / 2)
    assert closing == {"type": "websocket.close", "code": 4403}
    await stream.disconnect()
