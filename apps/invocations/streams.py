"""Who may open which stream, and how many streams one principal may hold."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from pydantic import TypeAdapter, ValidationError

from apps.invocations.requests import Identifier
from apps.tenants.models import Tenant

CLOSE_BAD_REQUEST = 4400
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4008
CLOSE_INTERNAL = 1011
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
        """A ticket for this run, an API key (its tenant's runs), or a staff session."""
        ticket = scope.get("ticket")
        if scope.get("ticket_given"):
            if ticket is None or ticket.run_id != run_id:
                return None
            return cls(
                ticket.tenant_id, f"{ticket.tenant_id}:{ticket.principal}", ticket.api_key_id
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
        return cls(found[0], f"{found[0]}:user:{user.pk}")


class _Slot:
    def __init__(self, slots: ConnectionSlots, key: str) -> None:
        self._slots, self._key = slots, key

    def release(self) -> None:
        self._slots.release(self._key)


class ConnectionSlots:
    """Caps concurrent streams per principal in this process (a flood is refused)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def acquire(self, key: str) -> _Slot | None:
        with self._lock:
            if self._open.get(key, 0) >= settings.TOOLHUB_WS_MAX_PER_PRINCIPAL:
                return None
            self._open[key] = self._open.get(key, 0) + 1
            return _Slot(self, key)

    def release(self, key: str) -> None:
        with self._lock:
            self._open[key] = max(0, self._open.get(key, 0) - 1)
            if not self._open[key]:
                del self._open[key]


connection_slots = ConnectionSlots()
