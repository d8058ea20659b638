"""The run stream: /ws/v1/runs/{runId}/?after=<seq>.

Replays persisted events after `after`, then continues live with no gap and no
duplicate at the seam: the consumer joins the run's group before replaying,
drops live events it already sent, and fills any gap it sees from the database.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from apps.invocations.events import remember_server_loop, run_group
from apps.invocations.models import RunEvent
from apps.invocations.streams import (
    CLOSE_BAD_REQUEST,
    CLOSE_FORBIDDEN,
    StreamAccess,
    connection_slots,
    refuse,
)

logger = logging.getLogger(__name__)

REPLAY_BATCH = 500


class RunConsumer(AsyncJsonWebsocketConsumer):
    tenant_id: int
    run_id: str
    last_seq: int = 0
    slot: Any = None

    async def connect(self) -> None:
        remember_server_loop()
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        after = StreamAccess.parse_after(self.scope)
        if after is None:
            await refuse(self, CLOSE_BAD_REQUEST)
            return
        access = await database_sync_to_async(StreamAccess.for_run)(self.scope, self.run_id)
        if access is None:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        self.slot = connection_slots.acquire(access.principal_key)
        if self.slot is None:
            await refuse(self, settings.TOOLHUB_WS_CLOSE_TOO_MANY)
            return
        self.tenant_id = access.tenant_id
        self.last_seq = after
        await self.accept()
        await self.channel_layer.group_add(
            run_group(self.tenant_id, self.run_id), self.channel_name
        )
        await self._send_from_database()

    async def disconnect(self, code: int) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None
        if hasattr(self, "tenant_id"):
            await self.channel_layer.group_discard(
                run_group(self.tenant_id, self.run_id), self.channel_name
            )

    async def run_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        seq = int(event["seq"])
        if seq <= self.last_seq:
            return  # already replayed
        if seq > self.last_seq + 1:
            await self._send_from_database()  # a push overtook another, or one was dropped
            if seq <= self.last_seq:
                return
        await self.send_json(event)
        self.last_seq = seq

    async def _send_from_database(self) -> None:
        while True:
            events = await self._events_after(self.last_seq)
            for event in events:
                await self.send_json(event)
                self.last_seq = int(event["seq"])
            if len(events) < REPLAY_BATCH:
                return

    @database_sync_to_async
    def _events_after(self, seq: int) -> list[dict[str, Any]]:
        return list(
            RunEvent.objects.filter(tenant_id=self.tenant_id, run_id=self.run_id, seq__gt=seq)
            .order_by("seq")
            .values_list("message", flat=True)[:REPLAY_BATCH]
        )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The stream is one-way; anything a client sends is ignored."""
