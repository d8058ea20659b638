"""Who may open which stream, and how many streams one principal may hold."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import redis.asyncio
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from pydantic import TypeAdapter, ValidationError

from apps.invocations.requests import Identifier
from apps.tenants.models import Tenant
from toolhub.server.draining import CLOSE_RESTARTING as CLOSE_RESTARTING  # the server stops: 4012
from toolhub.web import json_input

logger = logging.getLogger(__name__)

CLOSE_BAD_REQUEST = 4400
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# A replay from a seq whose next events retention pruned (apps/retention/gone.py): 410.
CLOSE_GONE = 4410
CLOSE_TOO_SLOW = 4008
# The server failed the stream: 1011's twin in the range Daphne sends
# (toolhub/server/daphne_frames.py).
CLOSE_INTERNAL = 4011
# Streams receive through this process's feeds (apps.invocations.fanout), so they
# need no channel of their own: an alias absent from CHANNEL_LAYERS gives them none.
NO_CHANNEL = "toolhub.no-channel"


async def refuse(consumer: Any, code: int) -> None:
    """Refuse a stream with a close code the client can read.

    Closing before accepting makes the server answer the handshake with a bare HTTP
    403 (Daphne does), which a client sees as 1006 and cannot tell apart from a
    network failure, a malformed request (4400) or a flood (4429). So the handshake
    is accepted, nothing is sent, and the connection is closed with the code.
    """
    await consumer.accept()
    await consumer.close(code=code)


class OneWayStream(AsyncJsonWebsocketConsumer):
    """A stream the server writes and the client only reads (the run and approvals streams).

    What a client sends is read with toolhub.web.json_input and ignored. A message that is
    not JSON (binary, malformed, nested too deeply, too large) closes the stream with
    4400 and an info line: channels' JSON consumer raised there, and Daphne logged a
    traceback and closed with 1011. What arrives once the server closed is dropped.
    """

    server_closed = False

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        return json_input.loads(text_data)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if self.server_closed:
            return
        if text_data is None:
            problem = "A binary message is not JSON."
        else:
            try:
                content = await self.decode_json(text_data)
            except json_input.JsonInputError as exc:
                problem = str(exc)
            else:
                await self.receive_json(content, **kwargs)
                return
        logger.info("closing a stream whose client sent a message that is not JSON: %s", problem)
        await self.end_stream(CLOSE_BAD_REQUEST)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The stream is one-way; anything a client sends is ignored."""

    async def end_stream(self, code: int) -> None:
        """Close from the server's side; a stream stops its sending first."""
        await self.close(code=code)

    async def close(self, code: Any = None, reason: Any = None) -> None:
        self.server_closed = True
        await super().close(code, reason)


_run_id = TypeAdapter(Identifier)


def is_run_id(text: str) -> bool:
    """The same rule as a call's `runId`: 1-128 characters of [A-Za-z0-9._:-]."""
    try:
        _run_id.validate_python(text)
    except ValidationError:
        return False
    return True


@dataclass(frozen=True)
class StreamAccess:
    tenant_id: int
    principal_key: str
    # The API key behind the stream (a Bearer key, or the key a ticket was issued
    # under): revoking it ends the stream (apps.invocations.revocations).
    api_key_id: int | None = None
    # The staff user of a session stream: its session and access are re-checked while it
    # is open (apps.invocations.revocations.SessionWatch), against this session: the
    # handshake's, or the one a ticket was issued under.
    staff_user_id: int | None = None
    session_key: str = ""

    @staticmethod
    def parse_after(scope: dict[str, Any]) -> int | None:
        """`?after=<seq>`: a non-negative integer; absent means from the start."""
        values = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get("after")
        if not values:
            return 0
        raw = values[0]
        if not raw.isdigit() or len(raw) > 18:
            return None
        return int(raw)

    @classmethod
    def for_run(cls, scope: dict[str, Any], run_id: str) -> StreamAccess | None:
        """A ticket for this run, an API key (its tenant's runs), or a staff session.

        A credential that is given but invalid refuses the stream, even when a valid
        one of a later kind (a session cookie) is also present: a client that named a
        credential never gets the stream under some other identity it did not mean.
        A ticket was already spent at the handshake, even when it is refused here."""
        ticket = scope.get("ticket")
        if scope.get("ticket_given"):
            if ticket is None or ticket.run_id != run_id:
                return None
            principal_key = f"{ticket.tenant_id}:{ticket.principal}"
            if ticket.api_key_id is not None:
                return cls(ticket.tenant_id, principal_key, ticket.api_key_id)
            return cls(
                ticket.tenant_id,
                principal_key,
                staff_user_id=ticket.user_id,
                session_key=ticket.session_key,
            )
        key = scope.get("api_key")
        if scope.get("bearer_given"):
            if key is None:
                return None
            return cls(key.tenant_id, f"{key.tenant_id}:{key.principal}", key.pk)
        user = scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            return None
        tenants = Tenant.objects.all() if user.is_superuser else Tenant.objects.filter(members=user)
        slug = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get("tenant", [None])[
            0
        ]
        if slug:
            tenants = tenants.filter(slug=slug)
        found = list(tenants.values_list("pk", flat=True)[:2])
        if len(found) != 1:
            return None
        session = scope.get("session")  # none: never re-checks as allowed
        return cls(
            found[0],
            f"{found[0]}:user:{user.pk}",
            staff_user_id=user.pk,
            session_key=(session.session_key if session is not None else None) or "",
        )


class _Slot:
    def __init__(self, slots: ConnectionSlots, key: str) -> None:
        self._slots, self._key = slots, key

    async def release(self) -> None:
        self._slots.release(self._key)


class ConnectionSlots:
    """Caps concurrent streams per principal in this process: the embedded mode's cap
    (one process), and the fallback of the shared cap while Redis does not answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def take(self, key: str) -> _Slot | None:
        with self._lock:
            if self._open.get(key, 0) >= settings.TOOLHUB_WS_MAX_PER_PRINCIPAL:
                return None
            self._open[key] = self._open.get(key, 0) + 1
            return _Slot(self, key)

    async def acquire(self, key: str) -> _Slot | SharedSlot | None:
        if settings.REDIS_URL:
            return await shared_slots.acquire(key)
        return self.take(key)

    def release(self, key: str) -> None:
        with self._lock:
            self._open[key] = max(0, self._open.get(key, 0) - 1)
            if not self._open[key]:
                del self._open[key]


connection_slots = ConnectionSlots()


# Shared slots live in Redis for SLOT_TTL_S and are renewed every SLOT_RENEW_S by the
# process holding them, so the streams of a process that died stop counting within
# SLOT_TTL_S: clients failing over to another process are not refused for long.
SLOT_TTL_S = 10
SLOT_RENEW_S = 3.0
_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[3]), ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]) + 1)
return 1
"""
_RENEW = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', t + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[1]) + 1)
end
return #KEYS
"""


class SharedSlot:
    def __init__(self, slots: SharedSlots, key: str, member: str) -> None:
        self._slots, self.key, self.member = slots, key, member

    async def release(self) -> None:
        await self._slots.release(self)


class SharedSlots:
    """The per-principal stream cap shared by every process through Redis (scale-out)."""

    def __init__(self) -> None:
        self.held: dict[str, SharedSlot] = {}
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._renewing: asyncio.Task[None] | None = None

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = redis.asyncio.Redis.from_url(
                settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
            )
        return client

    async def acquire(self, principal_key: str) -> SharedSlot | _Slot | None:
        key = f"toolhub:streams:{principal_key}"
        member = uuid.uuid4().hex
        try:
            taken = await self._client().eval(
                _ACQUIRE, 1, key, member, settings.TOOLHUB_WS_MAX_PER_PRINCIPAL, SLOT_TTL_S
            )
        except Exception as error:
            logger.warning("stream cap: Redis did not answer (%s); capping per process", error)
            return connection_slots.take(principal_key)
        if not taken:
            return None
        slot = self.held[member] = SharedSlot(self, key, member)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew())
        return slot

    async def release(self, slot: SharedSlot) -> None:
        self.held.pop(slot.member, None)
        try:
            await self._client().zrem(slot.key, slot.member)
        except Exception:
            logger.warning("stream cap: could not release a slot; it expires in %s s", SLOT_TTL_S)

    async def _renew(self) -> None:
        while self.held:
            await asyncio.sleep(SLOT_RENEW_S)
            slots = list(self.held.values())
            if not slots:
                return
            try:
                await self._client().eval(
                    _RENEW,
                    len(slots),
                    *(slot.key for slot in slots),
                    SLOT_TTL_S,
                    *(slot.member for slot in slots),
                )
            except Exception as error:
                logger.warning("stream cap: could not renew slots (%s); retrying", error)


shared_slots = SharedSlots()
