"""The Redis channel layer, with its sends in fewer round trips (issue 13).

channels-redis 4.3 sends to a group in four round trips: drop the group's expired
members, read the members, drop each member channel's expired messages, then a script
that checks each channel's capacity and adds the message. `send` takes four as well.
Every event a worker or web process pushes pays them, twice per call. `RedisLayer` keeps
the same keys, scores, expiries and capacity rule, so its processes and plain
channels-redis processes share one Redis; it only sends the same commands together:

- `group_send`: the member clean-up and read in one script, then one script per Redis
  host that drops each channel's expired messages and adds the message where there is
  room: one round trip for a group nobody follows (a queued call's run), two otherwise.
- `group_send_many`: several group messages, as `group_send` one after the other, with
  the same scripts pipelined: every group's read in one round trip per Redis host, then
  every delivery in another. A process's outbox sends the pushes waiting behind each
  other this way (apps/invocations/events.Outbox: a worker's call has two).
- `send`: one script (clean, check capacity, add, expire). A full channel still raises
  ChannelFull.

It adds `server_identity` (the servers' run ids), which a process's feeds watch to learn
that Redis restarted and forgot their groups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from redis.exceptions import NoScriptError

logger = logging.getLogger(__name__)

# The least step between two messages' scores (a score is seconds, a double: at today's
# times its resolution is under a microsecond).
STAMP_STEP_S = 1e-5

# KEYS: a group's key. ARGV: the oldest score a member keeps. Answers the members.
_MEMBERS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, tonumber(ARGV[1]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: the channels' keys, then the drop counter's. ARGV: one message per channel, then
# one capacity per channel, then the time now, the expiry in seconds and the counter's
# field (the group's kind). Answers how many channels were full; counts them in the hash.
_ADD_WHERE_ROOM = """
local count = #KEYS - 1
local now = tonumber(ARGV[2 * count + 1])
local expiry = tonumber(ARGV[2 * count + 2])
local full = 0
for i = 1, count do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, math.floor(now) - expiry)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[count + i]) then
        redis.call('ZADD', KEYS[i], now, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        full = full + 1
    end
end
if full > 0 then
    redis.call('HINCRBY', KEYS[count + 1], ARGV[2 * count + 3], full)
end
return full
"""

# KEYS: a process's channel key and its in-flight copy. ARGV: how many to take at most.
# Puts back what a read that was cancelled left in flight (as channels-redis's read does),
# then moves the oldest messages to the in-flight copy and answers them, oldest first.
_TAKE = """
local left = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #left, 1, -2 do
    redis.call('ZADD', KEYS[1], left[i], left[i - 1])
end
redis.call('DEL', KEYS[2])
local taken = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local members = {}
for i = 1, #taken, 2 do
    redis.call('ZADD', KEYS[2], taken[i + 1], taken[i])
    members[#members + 1] = taken[i]
end
if #members > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
end
return members
"""

# Messages dropped because a channel was full, by group kind, every process's (a hash in
# Redis, under the layer's prefix): toolhub_channel_layer_dropped_total in /metrics.
DROPPED_KEY = "toolhub:dropped"
GROUP_KINDS = ("run", "tenant")
# Drops are logged at WARNING once per interval, summed, never one line per message.
DROP_LOG_INTERVAL_S = 10.0


def group_kind(group: str) -> str:
    """A group's kind, a bounded label: `run` (a run's streams), `tenant` (operators'
    approval streams), `other`; `direct` for a send to one channel."""
    kind = group.split(".", 1)[0]
    return kind if kind in GROUP_KINDS else "other"


class DropLog:
    """Over-capacity drops of one process, logged once per DROP_LOG_INTERVAL_S, summed."""

    def __init__(self) -> None:
        self.pending: dict[str, int] = {}
        self.flushing: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, kind: str, count: int) -> None:
        """Count drops (on the event loop); the first of an interval schedules its line."""
        self.pending[kind] = self.pending.get(kind, 0) + count
        loop = asyncio.get_running_loop()
        if self.flushing is None or self.loop is not loop:  # (a loop that ended: a test's)
            self.loop = loop
            self.flushing = loop.call_later(DROP_LOG_INTERVAL_S, self.flush)

    def flush(self) -> None:
        self.flushing = None
        pending, self.pending = self.pending, {}
        if pending:
            logger.warning(
                "channel layer over capacity: %s messages dropped in the last %g s (%s); "
                "their streams catch up from the database",
                sum(pending.values()),
                DROP_LOG_INTERVAL_S,
                ", ".join(f"{kind}: {n}" for kind, n in sorted(pending.items())),
            )


drop_log = DropLog()


def dropped_counts(url: str, prefix: str = "asgi") -> dict[str, int]:
    """Every process's over-capacity drops so far, by group kind (read from Redis)."""
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        found = client.hgetall(prefix + DROPPED_KEY)
    finally:
        client.close()
    return {
        (key.decode() if isinstance(key, bytes) else key): int(value)
        for key, value in found.items()
    }


class RedisLayer(RedisChannelLayer):
    _last_stamp = 0.0

    def _stamp(self) -> float:
        """A new message's score: the time, but always after the last one this layer
        added. A channel is read in score order, and Redis orders equal scores by the
        message's bytes: adds pipelined together would otherwise be read out of order."""
        self._last_stamp = max(time.time(), self._last_stamp + STAMP_STEP_S)
        return self._last_stamp

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        name = channel
        if "!" in channel:  # process-local: the full name travels in the message
            message = {**message, "__asgi_channel__": channel}
            name = self.non_local_name(channel)
            index = self.consistent_hash(channel)
        else:
            index = next(self._send_index_generator)
        full = await self._add_where_room(
            index,
            [self.prefix + name],
            [self.serialize(message)],
            [self.get_capacity(channel)],
            "direct",
        )
        if full:
            raise ChannelFull()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        key = self._group_key(group)
        connection = self.connection(self.consistent_hash(group))
        members = await self._script(connection, _MEMBERS)(
            keys=[key], args=[int(time.time()) - self.group_expiry]
        )
        if not members:
            return
        names = [member.decode("utf8") for member in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(names, message)
        for index, keys in by_connection.items():
            full = await self._add_where_room(
                index,
                keys,
                [messages[k] for k in keys],
                [capacities[k] for k in keys],
                group_kind(group),
            )
            if full:
                drop_log.add(group_kind(group), full)

    async def group_send_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """`group_send` for each (group, message) in turn, in two pipelined round trips per
        Redis host instead of one or two each: every group's members first, then every
        delivery. A channel gets the messages in the order given, as from one group_send
        after the other. (A process's pushes waiting behind each other, apps/invocations/
        events.Outbox: a queued call's result and the next call's start, committed together.)"""
        reads: dict[int, list[tuple[int, list[str], list[Any]]]] = {}
        cutoff = int(time.time()) - self.group_expiry
        for order, (group, _) in enumerate(sends):
            assert self.require_valid_group_name(group), "Group name not valid"
            index = self.consistent_hash(group)
            reads.setdefault(index, []).append((order, [self._group_key(group)], [cutoff]))
        members: dict[int, Any] = {}
        for index, commands in reads.items():
            answers = await self._pipelined(index, _MEMBERS, [command[1:] for command in commands])
            members.update(zip([command[0] for command in commands], answers, strict=True))
        adds: dict[int, list[tuple[int, list[str], list[Any]]]] = {}
        for order, (group, message) in enumerate(sends):
            if not members[order]:
                continue
            names = [member.decode("utf8") for member in members[order]]
            by_connection, messages, capacities = self._map_channel_keys_to_connection(
                names, message
            )
            for index, keys in by_connection.items():
                values = [messages[key] for key in keys] + [capacities[key] for key in keys]
                stamp = [self._stamp(), int(self.expiry), group_kind(group)]
                adds.setdefault(index, []).append(
                    (order, [*keys, self.prefix + DROPPED_KEY], [*values, *stamp])
                )
        full: dict[int, int] = {}
        for index, commands in adds.items():
            answers = await self._pipelined(index, _ADD_WHERE_ROOM, [c[1:] for c in commands])
            for (order, _, _), count in zip(commands, answers, strict=True):
                full[order] = full.get(order, 0) + int(count)
        for order, count in full.items():
            if count:
                drop_log.add(group_kind(sends[order][0]), count)

    async def _pipelined(
        self, index: int, source: str, commands: list[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        """Run the script once per (keys, args), in order, in one round trip to a host; a
        run Redis lost the script for is sent again, in order, once it is loaded."""
        connection = self.connection(index)
        sha = self._script(connection, source).sha
        answers: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        for attempt in range(2):
            pipe = connection.pipeline(transaction=False)
            for n in todo:
                keys, args = commands[n]
                pipe.evalsha(sha, len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
            lost = []
            for n, result in zip(todo, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 0:
                    lost.append(n)
                elif isinstance(result, Exception):
                    raise result
                else:
                    answers[n] = result
            if not lost:
                break
            sha = await connection.script_load(source)
            todo = lost
        return answers

    async def server_identity(self) -> tuple[str, ...]:
        """The run id of each Redis server this layer uses: it changes when one restarts,
        and a restarted Redis has forgotten every group (apps/invocations/fanout.py)."""
        found = []
        for index in range(self.ring_size):
            info = await self.connection(index).info("server")
            found.append(str(info.get("run_id", "")))
        return tuple(found)

    async def _add_where_room(
        self, index: int, keys: list[str], messages: list[bytes], capacities: list[int], kind: str
    ) -> int:
        script = self._script(self.connection(index), _ADD_WHERE_ROOM)
        args = [*messages, *capacities, self._stamp(), int(self.expiry), kind]
        return int(await script(keys=[*keys, self.prefix + DROPPED_KEY], args=args))

    async def receive_single(self, channel: str) -> tuple[str | list[str], dict[str, Any]]:
        """A process's channels (`...!`, its feeds') are read in batches: one script takes
        every message waiting, up to the layer's capacity, into the in-flight copy, in one
        round trip, where channels-redis pays four per message (clean up, blocking pop, copy
        in flight, drop the copy); they go to their channels' buffers in order. Only when
        nothing waits does the read block, as channels-redis's. A read cancelled after the
        script ran leaves the batch in flight, and the next read puts it back: nothing is
        lost."""
        if not channel.endswith("!"):
            return await super().receive_single(channel)
        key = self.prefix + channel
        in_flight = self._backup_channel_name(key)
        connection = self.connection(self.consistent_hash(channel))
        await self.receive_clean_locks.acquire(key)
        try:
            members = await self._script(connection, _TAKE)(
                keys=[key, in_flight], args=[self.capacity]
            )
        except BaseException:
            self.receive_clean_locks.release(key)
            raise
        if not members:
            self.receive_clean_locks.release(key)
            return await super().receive_single(channel)
        cleaner = asyncio.ensure_future(connection.delete(in_flight))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Future[Any]) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(key)

        cleaner.add_done_callback(cleaned)
        # Every message goes to its channel's buffer now, in order; channels-redis's
        # receive() then reads its own from there (the empty list of channels it is
        # answered makes it buffer nothing more).
        self._buffer([self._unpack(channel, member) for member in members])
        return [], {}

    def receive_waiting(self, channel: str) -> list[dict[str, Any]]:
        """The messages for a process's channel already read and buffered here, without
        waiting (apps/invocations/fanout.Feed takes them with the one it received)."""
        buffer = self.receive_buffer.get(channel)
        if buffer is None:
            return []
        taken = []
        while not buffer.empty():
            taken.append(buffer.get_nowait())
        return taken

    def _unpack(self, channel: str, member: bytes) -> tuple[str | list[str], dict[str, Any]]:
        """A message and its channel, or the list of this process's channels it is for (a
        group message to several of them travels once)."""
        message = self.deserialize(member)
        return message.pop("__asgi_channel__", channel), message

    def _buffer(self, received: list[tuple[str | list[str], dict[str, Any]]]) -> None:
        for channels, message in received:
            for channel in [channels] if isinstance(channels, str) else channels:
                buffer = self.receive_buffer[channel]
                if buffer.full():  # a reader that stopped reading: the oldest goes
                    drop_log.add("local", 1)
                buffer.put_nowait(message)

    @staticmethod
    def _script(connection: Any, source: str) -> Any:
        """The script registered on this client (once: it is sent by its SHA after, and
        loaded again if Redis lost it)."""
        scripts = connection.__dict__.setdefault("_toolhub_scripts", {})
        script = scripts.get(source)
        if script is None:
            script = scripts[source] = connection.register_script(source)
        return script
