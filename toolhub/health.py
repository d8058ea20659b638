"""Liveness and readiness probes for load balancers and orchestrators."""

from __future__ import annotations

import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving requests; nothing else is checked."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when the database answers and the channel layer carries a message."""
    checks = {"database": _database_ok(), "channelLayer": _channel_layer_ok()}
    ready = all(checks.values())
    body = {"status": "ok" if ready else "unavailable", "checks": checks}
    return JsonResponse(body, status=200 if ready else 503)


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        return False


def _channel_layer_ok() -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False

    async def round_trip() -> bool:
        channel = await layer.new_channel("readyz.")
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "readyz.ping", "token": token})
        message = await layer.receive(channel)
        return bool(message.get("token") == token)

    try:
        return async_to_sync(round_trip)()
    except Exception:
        return False
