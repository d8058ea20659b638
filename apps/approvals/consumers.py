"""The operators' stream: /ws/v1/approvals/ — approvals appearing and being decided.

Staff sessions only. The consumer listens to the streams of the tenants the
user operates (through this process's feed of each, apps.invocations.fanout) and
re-checks, per message, that the user may decide that tool. Checks run in the
consumer's own task, so a slow one never holds up the feed; a stream whose
queue fills up anyway is closed with 4008 and the console re-reads the list.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from apps.invocations import revocations
from apps.invocations.events import remember_server_loop, tenant_group
from apps.invocations.fanout import feeds_for
from apps.invocations.revocations import StaffAccess, session_watch
from apps.invocations.streams import (
    CLOSE_FORBIDDEN,
    CLOSE_INTERNAL,
    CLOSE_TOO_SLOW,
    NO_CHANNEL,
    refuse,
)
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from apps.tools.permissions import can_decide
from toolhub.metrics import CountedStream

logger = logging.getLogger(__name__)


class ApprovalsConsumer(CountedStream, AsyncJsonWebsocketConsumer):
    stream_kind = "approvals"  # toolhub_open_streams
    channel_layer_alias = NO_CHANNEL  # events come through the tenants' feeds
    groups_joined: list[str]
    sender: asyncio.Future[None] | None = None
    watched: bool = False  # by revocations.SessionWatch

    async def connect(self) -> None:
        remember_server_loop()
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        self.decidable: dict[str, bool] = {}  # per tool, asked again after RECHECK_S
        self.decidable_at = asyncio.get_running_loop().time()
        self.queued: asyncio.Queue[tuple[dict[str, Any], str]] = asyncio.Queue(
            maxsize=settings.TOOLHUB_WS_QUEUED_EVENTS
        )
        await self.accept()
        self.sender = asyncio.ensure_future(self._send_queued())
        tenant_ids = await self._tenant_ids(user)
        # Ends the stream (4403) once the session ends or the user loses access.
        session = self.scope.get("session")  # none: never re-checks as allowed
        session_key = (session.session_key if session is not None else None) or ""
        # A tenant created later (for a superuser), or joined later, is added within
        # RECHECK_S (tenants_added).
        session_watch().watch(
            StaffAccess(user.pk, session_key, tuple(tenant_ids), follows_tenants=True), self
        )
        self.watched = True
        await self.tenants_added(tuple(tenant_ids))

    async def tenants_added(self, tenant_ids: tuple[int, ...]) -> None:
        """Listen to these tenants' approvals too (revocations.SessionWatch)."""
        layer = get_channel_layer()
        for tenant_id in tenant_ids:
            group = tenant_group(tenant_id)
            if self.sender is None or self.sender.done() or group in self.groups_joined:
                continue  # closed meanwhile, or already listening
            try:
                await feeds_for(layer).subscribe(layer, group, self)
            except Exception:
                logger.exception("approvals stream could not subscribe to live events")
                self.sender.cancel()
                await self.close(code=CLOSE_INTERNAL)
                return
            self.groups_joined.append(group)

    async def disconnect(self, code: int) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.watched:
            self.watched = False
            session_watch().unwatch(self)
        groups, self.groups_joined = self.groups_joined, []
        for group in groups:
            await feeds_for(get_channel_layer()).unsubscribe(group, self)

    async def offer(self, event: dict[str, Any], text: str) -> None:
        """An approval event from a tenant's feed; checked and sent by `_send_queued`."""
        if self.sender is None or self.sender.done():
            return
        try:
            self.queued.put_nowait((event, text))
        except asyncio.QueueFull:
            logger.info("closing an approvals stream that cannot keep up")
            self.sender.cancel()
            await self.close(code=CLOSE_TOO_SLOW)

    async def access_revoked(self) -> None:
        """The session ended or the user lost access (revocations.SessionWatch): 4403."""
        if self.sender is not None:
            self.sender.cancel()
        await self.close(code=CLOSE_FORBIDDEN)

    async def catch_up(self) -> None:
        """Nothing to re-read: this stream has no replay. The console re-reads its
        list whenever a message arrives and after every reconnect."""

    async def _send_queued(self) -> None:
        try:
            while True:
                event, text = await self.queued.get()
                if await self._may_decide(event["toolId"]):
                    await self.send(text_data=text)
        except Exception:
            logger.exception("approvals stream failed; closing it")
            await self.close(code=CLOSE_INTERNAL)

    @database_sync_to_async
    def _tenant_ids(self, user: Any) -> list[int]:
        tenants = Tenant.objects.all() if user.is_superuser else Tenant.objects.filter(members=user)
        return list(tenants.values_list("pk", flat=True))

    async def _may_decide(self, tool_id: str) -> bool:
        now = asyncio.get_running_loop().time()
        if (
            now - self.decidable_at > revocations.RECHECK_S
        ):  # a revoked permission holds within seconds
            self.decidable, self.decidable_at = {}, now
        if tool_id not in self.decidable:
            self.decidable[tool_id] = await self._check(tool_id)
        return self.decidable[tool_id]

    @database_sync_to_async
    def _check(self, tool_id: str) -> bool:
        tool = Tool.objects.filter(pk=tool_id).first()
        return tool is not None and can_decide(self.scope["user"], tool)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """One-way stream; client messages are ignored."""
