"""Waiting for a stream's subscription in this process (apps.invocations.fanout)."""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer

from apps.invocations.fanout import feeds_for


async def listening(group: str, subscribers: int = 1, timeout: float = 5.0) -> None:
    """Until `subscribers` streams listen to `group` through this process's feed of it.

    A stream's handshake completes before its feed has joined the group, and an event
    pushed in between reaches none of its subscribers. An approvals stream's first
    re-read sends such an event only if its approval request exists
    (ApprovalRequest.objects.events_since): a test that emits bare approval events waits
    for this first, or its first event may be lost to the race."""

    async def subscribed() -> None:
        feeds = feeds_for(get_channel_layer())
        while True:
            feed = feeds.by_group.get(group)
            if (
                feed is not None
                and feed.ready.is_set()
                and feed.tasks
                and len(feed.subscribers) >= subscribers
            ):
                return
            await asyncio.sleep(0.005)

    await asyncio.wait_for(subscribed(), timeout)
