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

import logging
import time
from typing import Any

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

# KEYS: the channels' keys. ARGV: one message per key, then one capacity per key, then
# the time now and the expiry in seconds. Answers how many channels were full.
_ADD_WHERE_ROOM = """
local count = #KEYS
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
return full
"""


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
            index, [self.prefix + name], [self.serialize(message)], [self.get_capacity(channel)]
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
                index, keys, [messages[k] for k in keys], [capacities[k] for k in keys]
            )
            if full:
                logger.info("%s of %s channels over capacity in group %s", full, len(names), group)

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
        for order, (_, message) in enumerate(sends):
            if not members[order]:
                continue
            names = [member.decode("utf8") for member in members[order]]
            by_connection, messages, capacities = self._map_channel_keys_to_connection(
                names, message
            )
            for index, keys in by_connection.items():
                values = [messages[key] for key in keys] + [capacities[key] for key in keys]
                stamp = [self._stamp(), int(self.expiry)]
                adds.setdefault(index, []).append((order, keys, [*values, *stamp]))
        full: dict[int, int] = {}
        for index, commands in adds.items():
            answers = await self._pipelined(index, _ADD_WHERE_ROOM, [c[1:] for c in commands])
            for (order, _, _), count in zip(commands, answers, strict=True):
                full[order] = full.get(order, 0) + int(count)
        for order, count in full.items():
            if count:
                group = sends[order][0]
                logger.info(
                    "%s of %s channels over capacity in group %s",
                    count,
                    len(members[order]),
                    group,
                )

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
        self, index: int, keys: list[str], messages: list[bytes], capacities: list[int]
    ) -> int:
        script = self._script(self.connection(index), _ADD_WHERE_ROOM)
        return int(
            await script(keys=keys, args=[*messages, *capacities, self._stamp(), int(self.expiry)])
        )

    @staticmethod
    def _script(connection: Any, source: str) -> Any:
        """The script registered on this client (once: it is sent by its SHA after, and
        loaded again if Redis lost it)."""
        scripts = connection.__dict__.setdefault("_toolhub_scripts", {})
        script = scripts.get(source)
        if script is None:
            script = scripts[source] = connection.register_script(source)
        return script
