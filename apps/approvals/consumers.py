"""The operators' stream: /ws/v1/approvals/ — approvals appearing and being decided.

Staff sessions only. The consumer listens to the streams of the tenants the
user operates (through this process's feed of each, apps.invocations.fanout) and
re-checks, per message, that the user may decide that tool. Checks run in the
consumer's own task, so a slow one never holds up the feed; a stream whose
queue fills up anyway is closed with 4008 and the console re-reads the list.

When the feed may have missed pushes (a catch-up: the layer dropped some), the
stream re-reads from the database the approval events of its tenants written since
its last re-read (less CATCH_UP_MARGIN) and sends those it has not seen, in order.
It does so once when it opens too, after its feeds joined their groups: the client
sees the handshake before that, and what was pushed in between reached no feed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from datetime import datetime, timedelta
from typing import Any, Final

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from apps.approvals.models import ApprovalRequest
from apps.invocations import revocations
from apps.invocations.events import remember_server_loop, tenant_group
from apps.invocations.fanout import encode, feeds_for
from apps.invocations.revocations import StaffAccess, session_watch
from apps.invocations.streams import (
    CLOSE_FORBIDDEN,
    CLOSE_INTERNAL,
    CLOSE_TOO_SLOW,
    NO_CHANNEL,
    OneWayStream,
    refuse,
)
from apps.tenants.scoping import staff_tenants
from apps.tools.models import Tool
from apps.tools.permissions import can_decide
from toolhub.ops.metrics import CountedStream

logger = logging.getLogger(__name__)

# A re-read after a catch-up starts this long before the previous one (or the stream's
# opening): an event is stamped before its transaction commits, and processes' clocks
# differ a little. What the stream already sent in that overlap is not sent again.
CATCH_UP_MARGIN = timedelta(seconds=10)
SEEN_LIMIT = 5_000  # approval events remembered (by approvalId and seq) to skip in a re-read


class _CatchUp:
    """The queue's mark for "re-read what the feed may have missed" (after what it holds)."""


CATCH_UP: Final = _CatchUp()


class _TenantFeed:
    """A stream's subscription to one tenant's feed: its events reach the stream with
    that tenant, since whether the user may decide one depends on their role there."""

    def __init__(self, stream: ApprovalsConsumer, tenant_id: int) -> None:
        self.stream, self.tenant_id = stream, tenant_id

    async def offer(self, event: dict[str, Any], text: str) -> None:
        await self.stream.offer(event, text, self.tenant_id)

    async def catch_up(self) -> None:
        await self.stream.catch_up()


class ApprovalsConsumer(CountedStream, OneWayStream):
    stream_kind = "approvals"  # toolhub_open_streams
    channel_layer_alias = NO_CHANNEL  # events come through the tenants' feeds
    tenant_ids: list[int]  # the tenants whose feeds it listens to
    feeds: dict[int, _TenantFeed]  # its subscription to each
    sender: asyncio.Future[None] | None = None
    watched: bool = False  # by revocations.SessionWatch
    catch_up_queued: bool = False

    async def connect(self) -> None:
        remember_server_loop()
        self.tenant_ids, self.feeds = [], {}
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        # per (tenant, tool), asked again after RECHECK_S
        self.decidable: dict[tuple[int, str], bool] = {}
        self.decidable_at = asyncio.get_running_loop().time()
        self.queued: asyncio.Queue[tuple[dict[str, Any], str, int] | _CatchUp] = asyncio.Queue(
            maxsize=settings.TOOLHUB_WS_QUEUED_EVENTS
        )
        self.seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        # The first re-read (below) covers the moments between the handshake and the
        # feeds' subscriptions, and events stamped a little before (CATCH_UP_MARGIN).
        self.read_since: datetime = timezone.now() - CATCH_UP_MARGIN
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
        # The client may act on the handshake (the console reads its list) before the
        # feeds joined their groups: an approval pushed in between reached no feed here.
        # One re-read once subscribed sends what the live path may have missed.
        await self.catch_up()

    async def tenants_added(self, tenant_ids: tuple[int, ...]) -> None:
        """Listen to these tenants' approvals too (revocations.SessionWatch)."""
        layer = get_channel_layer()
        for tenant_id in tenant_ids:
            group = tenant_group(tenant_id)
            if self.sender is None or self.sender.done() or tenant_id in self.tenant_ids:
                continue  # closed meanwhile, or already listening
            feed = self.feeds[tenant_id] = _TenantFeed(self, tenant_id)
            try:
                await feeds_for(layer).subscribe(layer, group, feed)
            except Exception:
                logger.exception("approvals stream could not subscribe to live events")
                self.sender.cancel()
                await self.close(code=CLOSE_INTERNAL)
                return
            self.tenant_ids.append(tenant_id)

    async def disconnect(self, code: int) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.watched:
            self.watched = False
            session_watch().unwatch(self)
        tenant_ids, self.tenant_ids = self.tenant_ids, []
        for tenant_id in tenant_ids:
            feed = self.feeds.pop(tenant_id, None)
            if feed is not None:
                await feeds_for(get_channel_layer()).unsubscribe(tenant_group(tenant_id), feed)

    async def offer(self, event: dict[str, Any], text: str, tenant_id: int) -> None:
        """An approval event from a tenant's feed; checked and sent by `_send_queued`."""
        await self._enqueue((event, text, tenant_id))

    async def _enqueue(self, item: tuple[dict[str, Any], str, int] | _CatchUp) -> None:
        if self.sender is None or self.sender.done():
            return
        try:
            self.queued.put_nowait(item)
        except asyncio.QueueFull:
            logger.info("closing an approvals stream that cannot keep up")
            self.sender.cancel()
            await self.close(code=CLOSE_TOO_SLOW)

    async def access_revoked(self) -> None:
        """The session ended or the user lost access (revocations.SessionWatch): 4403."""
        await self.end_stream(CLOSE_FORBIDDEN)

    async def end_stream(self, code: int) -> None:
        if self.sender is not None:
            self.sender.cancel()
        await self.close(code=code)

    async def catch_up(self) -> None:
        """The feed may have missed pushes: re-read the database in this stream's own
        task, after what is already queued (one re-read queued at a time)."""
        if not self.catch_up_queued:
            self.catch_up_queued = True
            await self._enqueue(CATCH_UP)

    async def _send_queued(self) -> None:
        try:
            while True:
                item = await self.queued.get()
                if isinstance(item, _CatchUp):
                    self.catch_up_queued = False
                    for tenant_id, event in await self._missed(tuple(self.tenant_ids)):
                        await self._send_new(event, encode(event), tenant_id)
                    continue
                await self._send_new(*item)
        except Exception:
            logger.exception("approvals stream failed; closing it")
            await self.close(code=CLOSE_INTERNAL)

    async def _send_new(self, event: dict[str, Any], text: str, tenant_id: int) -> None:
        """Send an event this stream has not handled yet, if the user may decide it."""
        key = (str(event.get("approvalId")), int(event.get("seq") or 0))
        if key in self.seen:
            return
        self.seen[key] = None
        if len(self.seen) > SEEN_LIMIT:
            self.seen.popitem(last=False)
        if await self._may_decide(tenant_id, event["toolId"]):
            await self.send(text_data=text)

    @database_sync_to_async
    def _missed(self, tenant_ids: tuple[int, ...]) -> list[tuple[int, dict[str, Any]]]:
        since, self.read_since = self.read_since, timezone.now() - CATCH_UP_MARGIN
        return ApprovalRequest.objects.tenant_events_since(tenant_ids, since)

    @database_sync_to_async
    def _tenant_ids(self, user: Any) -> list[int]:
        return list(staff_tenants(user).values_list("pk", flat=True))

    async def _may_decide(self, tenant_id: int, tool_id: str) -> bool:
        now = asyncio.get_running_loop().time()
        if (
            now - self.decidable_at > revocations.RECHECK_S
        ):  # a revoked permission holds within seconds
            self.decidable, self.decidable_at = {}, now
        key = (tenant_id, tool_id)
        if key not in self.decidable:
            self.decidable[key] = await self._check(tenant_id, tool_id)
        return self.decidable[key]

    @database_sync_to_async
    def _check(self, tenant_id: int, tool_id: str) -> bool:
        tool = Tool.objects.filter(pk=tool_id).first()
        return tool is not None and can_decide(self.scope["user"], tool, tenant_id)
