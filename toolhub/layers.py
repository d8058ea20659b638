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

logger = logging.getLogger(__name__)

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
            await script(keys=keys, args=[*messages, *capacities, time.time(), int(self.expiry)])
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
