"""Liveness and readiness probes for load balancers and orchestrators.

/readyz is an async view: it runs on the server's event loop, never waits for the
one thread Daphne gives sync views, and bounds every probe. A probe that does not
answer in PROBE_TIMEOUT_S counts as down. The answer itself is not bounded: it waits
for the event loop, so a busy process answers later (docs/deployment.md#health-checks).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse

PROBE_TIMEOUT_S = 0.8


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving requests; nothing else is checked."""
    return JsonResponse({"status": "ok"})


async def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when the database answers and the channel layer carries a message."""
    database, channel_layer = await asyncio.gather(
        _bounded(sync_to_async(_database_ok, thread_sensitive=False)()),
        _bounded(_channel_layer_ok()),
    )
    checks = {"database": database, "channelLayer": channel_layer}
    ready = all(checks.values())
    body = {"status": "ok" if ready else "unavailable", "checks": checks}
    return JsonResponse(body, status=200 if ready else 503)


async def _bounded(probe: Awaitable[Any]) -> bool:
    try:
        return bool(await asyncio.wait_for(probe, PROBE_TIMEOUT_S))
    except Exception:
        return False


def _database_ok() -> bool:
    """Runs in a thread of its own (a probe must not queue behind requests); its
    connection is closed after, so probe threads hold none between probes."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        return False
    finally:
        connection.close()


async def _channel_layer_ok() -> bool:
    """A message to this process and back.

    The probe's channel uses the default "specific" prefix on purpose: channels-redis
    lets one receiver at a time pop a process's messages (its receive lock), and that
    receiver is often a stream feed blocked on the "specific" queue. A channel under
    another prefix would wait behind it until the next event reached this process; one
    under the same prefix is popped by whoever holds the lock and handed over.
    """
    layer = get_channel_layer()
    if layer is None:
        return False
    channel = await layer.new_channel()
    token = uuid.uuid4().hex
    await layer.send(channel, {"type": "readyz.ping", "token": token})
    message = await layer.receive(channel)
    return bool(message.get("token") == token)
