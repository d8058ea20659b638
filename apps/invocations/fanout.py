"""Live fan-out inside one server process: one channel-layer subscription per group.

A run with a thousand open streams in a process used to be a thousand group
members: the layer copied every event a thousand times, every consumer woke up,
dispatched it and encoded the same JSON again. Now each process joins a group
*once*, through a `Feed`. The feed reads the group's messages in one task,
encodes each event once and hands the text to every local subscriber, which
writes it to its socket straight away unless it must queue it (it is catching
up, pacing a slow client, or saw a gap). Processes still fan out to each other
through the channel layer (Redis in scale-out mode): one group member each.

Feeds belong to the event loop that serves the streams (Daphne has one); the
first subscriber to a group starts its feed, the last one to leave stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from toolhub.server import send_batches

logger = logging.getLogger(__name__)

# Group membership expires in the channel layer (group_expiry, a day): a feed
# re-joins hourly so a stream open for days keeps receiving live events.
GROUP_REFRESH_S = 3600.0
# A feed whose layer fails (Redis restarted...) retries after this long.
RETRY_S = 1.0
# How often the feeds of a process ask a layer that can say so (Redis) which server
# answers: a restarted Redis has forgotten every group, and the feeds must learn it even
# when no read of theirs failed (below).
WATCH_S = 2.0
# Other tasks on the loop (HTTP requests, handshakes) get a turn this often
# while one event is handed to many subscribers.
YIELD_EVERY = 200
# The feeds' channels (their capacity is the layer's `channel_capacity` for `feed.*`: all
# the feeds of a process share it, toolhub/settings.py).
FEED_PREFIX = "feed"
# A group message that carries no event: pushes to this group were lost (a sender's
# layer failed), so every subscriber re-reads what it can (events.Outbox sends it).
CATCH_UP_TYPE = "feed.catch_up"


def encode(event: dict[str, Any]) -> str:
    """The one wire encoding of an event, live and replayed alike."""
    return json.dumps(event, separators=(",", ":"))


class FeedUnavailable(Exception):
    """The channel layer refused a feed's subscription (Redis down...)."""


class Subscriber(Protocol):
    async def offer(self, event: dict[str, Any], text: str) -> None:
        """Take one live event. Must not wait on the client: a subscriber that
        cannot send now queues the event for its own task."""

    async def catch_up(self) -> None:
        """The feed may have missed events (its layer failed): re-read what can be
        re-read. Must not wait on the client either."""


class Feed:
    """One group's live events in this process, read once, handed to every subscriber."""

    def __init__(self, layer: Any, group: str, owner: Feeds) -> None:
        self.layer, self.group = layer, group
        self.owner = owner
        self.stopped = False
        self.subscribers: dict[Subscriber, None] = {}  # insertion-ordered set
        self.channel: str | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()

    async def start(self) -> None:
        try:
            self.channel = await self.layer.new_channel(prefix=FEED_PREFIX)
            await self.layer.group_add(self.group, self.channel)
            self.tasks = [
                asyncio.ensure_future(self._read()),
                asyncio.ensure_future(self._keep_membership()),
            ]
        finally:
            self.ready.set()

    async def stop(self) -> None:
        self.stopped = True
        for task in self.tasks:
            task.cancel()
        if self.channel is not None:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:
                logger.exception("could not leave group %s", self.group)

    async def _read(self) -> None:
        assert self.channel is not None
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Events pushed meanwhile may be lost to the feed, but they are
                # persisted: once the layer answers again, subscribers re-read them.
                logger.warning(
                    "feed for %s could not read (%s); retrying", self.group, type(exc).__name__
                )
                await asyncio.sleep(RETRY_S)
                # A restarted Redis has forgotten every group, not only this one; and
                # the process's feeds share one blocking read, so this feed may be the
                # only one that saw the failure. Every feed joins again, as long as it
                # takes, and every subscriber re-reads what it missed.
                await self.owner.repair(self.layer)
                continue
            await self._take([message, *self._waiting()])

    def _waiting(self) -> list[dict[str, Any]]:
        """The messages already read for this feed and waiting in this process: a layer
        that reads in batches (toolhub.layers.redis_layer.RedisLayer) says which. A busy
        run's events then go to each subscriber together, in one write, rather than one by
        one."""
        waiting = getattr(self.layer, "receive_waiting", None)
        if waiting is None:
            return []
        return list(waiting(self.channel))

    async def _take(self, messages: list[dict[str, Any]]) -> None:
        batch: list[dict[str, Any]] = []
        for message in messages:
            if message.get("type") == CATCH_UP_TYPE:
                await self.hand_out_all(batch)
                batch = []
                await self._each(lambda subscriber: subscriber.catch_up())
                continue
            event = message.get("event")
            if isinstance(event, dict):
                batch.append(event)
            events = message.get("events")  # events committed together (events._push_all)
            if isinstance(events, list):
                batch.extend(event for event in events if isinstance(event, dict))
        await self.hand_out_all(batch)

    async def hand_out(self, event: dict[str, Any]) -> None:
        text = encode(event)
        await self._each(lambda subscriber: subscriber.offer(event, text))

    async def hand_out_all(self, batch: list[dict[str, Any]]) -> None:
        """Each subscriber takes the whole batch in turn: the last event of the batch (a
        quick call's result) reaches the first subscribers without waiting for the first
        event's fan-out to everyone, and a socket's frames of one batch leave together
        (toolhub/server/send_batches.py)."""
        if not batch:
            return
        if len(batch) == 1:
            await self.hand_out(batch[0])
            return
        encoded = [(event, encode(event)) for event in batch]

        async def offer_all(subscriber: Subscriber) -> None:
            with send_batches.together():
                for event, text in encoded:
                    await subscriber.offer(event, text)

        await self._each(offer_all)

    async def _each(self, call: Callable[[Subscriber], Awaitable[None]]) -> None:
        for n, subscriber in enumerate(tuple(self.subscribers)):
            try:
                await call(subscriber)
            except Exception:
                logger.exception("a subscriber of %s failed to take an event", self.group)
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)

    async def _keep_membership(self) -> None:
        while True:
            await asyncio.sleep(GROUP_REFRESH_S)
            await self._join()

    async def _join(self) -> bool:
        try:
            await self.layer.group_add(self.group, self.channel)
        except Exception as exc:
            logger.warning("could not re-join group %s (%s)", self.group, type(exc).__name__)
            return False
        return True

    async def rejoin(self) -> None:
        """Join the group again, as long as it takes (unless the feed stops meanwhile),
        then tell every subscriber that it may have missed events."""
        while not self.stopped and not await self._join():
            await asyncio.sleep(RETRY_S)
        if self.stopped:
            # Stopped while it waited: a join that landed after stop()'s leave is undone.
            with contextlib.suppress(Exception):
                await self.layer.group_discard(self.group, self.channel)
            return
        await self._each(lambda subscriber: subscriber.catch_up())


class Feeds:
    """The feeds of one event loop and channel layer, by group.

    The feeds of a process share their layer's connections, and on Redis one blocking
    read serves them all: when Redis restarts, only the feed whose read was waiting sees
    the error, and none sees it if Redis went away between two reads. Yet a restarted
    Redis has forgotten every group. So a failure seen by one feed repairs them all
    (`repair`), and while there are feeds, a watcher asks the layer every `WATCH_S`
    which server answers (`server_identity`, Redis's run ids) and repairs them all when
    it changes or after it could not ask.
    """

    def __init__(self) -> None:
        self.by_group: dict[str, Feed] = {}
        self._repairing: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def repair(self, layer: Any) -> None:
        """Every feed joins its group again and its subscribers catch up; one repair at a
        time (callers during one wait for it)."""
        if self._repairing is None or self._repairing.done():
            self._repairing = asyncio.ensure_future(self._repair_all())
        await asyncio.shield(self._repairing)

    async def _repair_all(self) -> None:
        feeds = [feed for feed in self.by_group.values() if feed.tasks]
        logger.warning("channel layer failed: %d feeds join their groups again", len(feeds))
        for feed in feeds:
            if self.by_group.get(feed.group) is feed:  # not stopped meanwhile
                await feed.rejoin()

    async def _watch(self, layer: Any) -> None:
        identity = layer.server_identity
        known: Any = None
        failed = False
        while True:
            try:
                now = await identity()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failed:
                    logger.warning("channel layer did not answer (%s)", type(exc).__name__)
                failed = True
            else:
                if known is not None and (failed or now != known):
                    # Restarted (its groups are gone), or down a while (pushes were lost).
                    await self.repair(layer)
                known, failed = now, False
            await asyncio.sleep(WATCH_S)

    def _start_watching(self, layer: Any) -> None:
        if hasattr(layer, "server_identity") and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.ensure_future(self._watch(layer))

    def _stop_watching(self) -> None:
        if not self.by_group and self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def subscribe(self, layer: Any, group: str, subscriber: Subscriber) -> None:
        feed = self.by_group.get(group)
        if feed is None:
            feed = self.by_group[group] = Feed(layer, group, self)
            feed.subscribers[subscriber] = None
            try:
                await feed.start()
            except BaseException:
                if self.by_group.get(group) is feed:
                    del self.by_group[group]
                self._stop_watching()
                raise
            self._start_watching(layer)
        else:
            feed.subscribers[subscriber] = None
            await feed.ready.wait()
            if not feed.tasks:  # its start failed: the first subscriber has the error
                feed.subscribers.pop(subscriber, None)
                raise FeedUnavailable(f"could not subscribe to {group}")

    async def unsubscribe(self, group: str, subscriber: Subscriber) -> None:
        feed = self.by_group.get(group)
        if feed is None:
            return
        feed.subscribers.pop(subscriber, None)
        if not feed.subscribers:
            del self.by_group[group]
            self._stop_watching()
            await feed.stop()


_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Feeds]] = (
    weakref.WeakKeyDictionary()
)


def feeds_for(layer: Any) -> Feeds:
    """This loop's feeds on `layer` (tests run one loop per test; Daphne one in all)."""
    per_layer = _feeds.setdefault(asyncio.get_running_loop(), {})
    return per_layer.setdefault(id(layer), Feeds())
