"""A revoked API key's streams end (4403) within seconds, in every process; so do the
streams of a staff session that ended or of a user who lost access (SessionWatch).

Revoking a key (`ApiKey.revoke`) sends `key_revoked` once committed; the receiver
here pushes the key's id to one channel-layer group that every server process with
key streams listens to (through a Feed, as run events arrive), and each process
closes its streams of that key. A push can be lost (Redis restarting, a key
revoked by editing `revoked_at` in the admin), so each process also re-reads, every
RECHECK_S seconds, which of its streams' keys are still active: one query per
process per interval, none per event.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.dispatch import receiver
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from apps.invocations.events import _group_send
from apps.invocations.fanout import feeds_for
from apps.tenants.models import ApiKey, Membership, Tenant, key_revoked

logger = logging.getLogger(__name__)

REVOCATIONS_GROUP = "toolhub.key-revocations"
RECHECK_S = 3.0


class KeyStream(Protocol):
    async def key_revoked(self) -> None:
        """Close the stream (4403): its key is revoked."""


@receiver(key_revoked)
def push_revocation(sender: Any, key: ApiKey, **kwargs: Any) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        _group_send(
            layer, REVOCATIONS_GROUP, {"type": "key.revoked", "event": {"apiKeyId": key.pk}}
        )
    except Exception:
        # The periodic re-check still ends the key's streams, a few seconds later.
        logger.exception("could not push the revocation of API key %s", key.pk)


class _Rechecked(Protocol):
    async def recheck(self) -> None: ...


async def _recheck_every(watch: _Rechecked) -> None:
    """The safety net of both watches: re-read what their streams depend on every
    RECHECK_S seconds, whatever pushes were lost."""
    while True:
        await asyncio.sleep(RECHECK_S)
        try:
            await watch.recheck()
        except Exception:
            logger.exception("could not re-check the access of open streams")


class KeyWatch:
    """This event loop's streams by the API key that opened them."""

    def __init__(self) -> None:
        self.streams: dict[int, dict[KeyStream, None]] = {}
        self.rechecking: asyncio.Task[None] | None = None
        self.listening = False
        self.lock = asyncio.Lock()

    async def watch(self, key_id: int, stream: KeyStream) -> None:
        self.streams.setdefault(key_id, {})[stream] = None
        if self.rechecking is None:
            self.rechecking = asyncio.ensure_future(_recheck_every(self))
        async with self.lock:
            if not self.listening and self.streams:
                layer = get_channel_layer()
                try:
                    await feeds_for(layer).subscribe(layer, REVOCATIONS_GROUP, self)
                    self.listening = True
                except Exception:
                    logger.exception("could not listen for key revocations; re-checking only")

    async def unwatch(self, key_id: int, stream: KeyStream) -> None:
        streams = self.streams.get(key_id, {})
        streams.pop(stream, None)
        if not streams:
            self.streams.pop(key_id, None)
        if self.streams:
            return
        if self.rechecking is not None:
            self.rechecking.cancel()
            self.rechecking = None
        async with self.lock:
            if self.listening and not self.streams:
                self.listening = False
                await feeds_for(get_channel_layer()).unsubscribe(REVOCATIONS_GROUP, self)

    async def offer(self, event: dict[str, Any], text: str) -> None:
        """A revocation pushed from any process."""
        key_id = event.get("apiKeyId")
        if isinstance(key_id, int):
            await self._end(key_id)

    async def catch_up(self) -> None:
        """The layer failed: pushes may be lost, so re-check now."""
        await self.recheck()

    async def recheck(self) -> None:
        ids = list(self.streams)
        if ids:
            active = await _active_among(ids)
            for key_id in ids:
                if key_id not in active:
                    await self._end(key_id)

    async def _end(self, key_id: int) -> None:
        for stream in tuple(self.streams.get(key_id, {})):
            try:
                await stream.key_revoked()
            except Exception:
                logger.exception("could not close a stream of revoked API key %s", key_id)


@database_sync_to_async
def _active_among(ids: list[int]) -> set[int]:
    return set(
        ApiKey.objects.get_queryset().active().filter(pk__in=ids).values_list("pk", flat=True)
    )


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeyWatch] = (
    weakref.WeakKeyDictionary()
)


def _this_loops[W](
    registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, W], make: type[W]
) -> W:
    """The running loop's watch (tests run one loop per test; Daphne one in all)."""
    loop = asyncio.get_running_loop()
    watch = registry.get(loop)
    if watch is None:
        watch = registry[loop] = make()
    return watch


def key_watch() -> KeyWatch:
    return _this_loops(_watches, KeyWatch)


# ---------------------------------------------------------------- staff sessions


@dataclass(frozen=True)
class StaffAccess:
    """What a stream opened with a staff session depends on: the session, the user, and
    the tenants the stream serves (membership, unless the user is a superuser)."""

    user_id: int
    session_key: str
    tenant_ids: tuple[int, ...]
    # The stream serves every tenant its user operates, not a fixed set: a tenant the
    # user gains (a new tenant, for a superuser; a new membership) is added to it.
    follows_tenants: bool = False


class StaffStream(Protocol):
    async def access_revoked(self) -> None:
        """Close the stream (4403): its session or its user lost access."""


class FollowingStream(StaffStream, Protocol):
    async def tenants_added(self, tenant_ids: tuple[int, ...]) -> None:
        """Serve these tenants too (asked of streams watched with `follows_tenants`)."""


class SessionWatch:
    """This event loop's staff-session streams, re-checked every RECHECK_S seconds.

    A stream ends (4403) once its session is gone (logout, expiry, a password change,
    which Django's session hash ties the session to) or its user is deactivated, loses
    staff status, or leaves a tenant the stream serves: one query per kind of row per
    process per interval, none per event. A stream that follows its user's tenants is
    handed the tenants the user gained since (within RECHECK_S, as a loss is).
    """

    def __init__(self) -> None:
        self.streams: dict[StaffStream, StaffAccess] = {}
        self.rechecking: asyncio.Task[None] | None = None

    def watch(self, access: StaffAccess, stream: StaffStream) -> None:
        self.streams[stream] = access
        if self.rechecking is None:
            self.rechecking = asyncio.ensure_future(_recheck_every(self))

    def unwatch(self, stream: StaffStream) -> None:
        self.streams.pop(stream, None)
        if not self.streams and self.rechecking is not None:
            self.rechecking.cancel()
            self.rechecking = None

    async def recheck(self) -> None:
        watched = dict(self.streams)
        if not watched:
            return
        allowed, operated = await _still_allowed(set(watched.values()))
        for stream, access in watched.items():
            if access not in allowed:
                self.streams.pop(stream, None)
                try:
                    await stream.access_revoked()
                except Exception:
                    logger.exception("could not close a stream of user %s", access.user_id)
                continue
            gained = tuple(sorted(operated.get(access.user_id, set()) - set(access.tenant_ids)))
            if not access.follows_tenants or not gained or self.streams.get(stream) != access:
                continue
            self.streams[stream] = replace(access, tenant_ids=access.tenant_ids + gained)
            try:
                await cast(FollowingStream, stream).tenants_added(gained)
            except Exception:
                logger.exception("could not add tenants to a stream of user %s", access.user_id)


@database_sync_to_async
def _still_allowed(accesses: set[StaffAccess]) -> tuple[set[StaffAccess], dict[int, set[int]]]:
    """The accesses that still hold, and the tenants each following stream's user now
    operates (every tenant, for a superuser)."""
    user_ids = {access.user_id for access in accesses}
    users = {
        user.pk: user
        for user in User.objects.filter(pk__in=user_ids, is_active=True, is_staff=True)
    }
    sessions = {
        session.session_key: session.get_decoded()
        for session in Session.objects.filter(
            session_key__in={access.session_key for access in accesses},
            expire_date__gt=timezone.now(),
        )
    }
    memberships = set(
        Membership.objects.filter(user_id__in=users).values_list("tenant_id", "user_id")
    )
    allowed = set()
    for access in accesses:
        user, data = users.get(access.user_id), sessions.get(access.session_key)
        if user is None or data is None or str(data.get(SESSION_KEY)) != str(user.pk):
            continue
        if not constant_time_compare(
            str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash()
        ):
            continue  # the password changed: Django's own requests end this session too
        if user.is_superuser or all(
            (tenant_id, user.pk) in memberships for tenant_id in access.tenant_ids
        ):
            allowed.add(access)
    followers = {access.user_id for access in allowed if access.follows_tenants}
    operated: dict[int, set[int]] = {user_id: set() for user_id in followers}
    for tenant_id, user_id in memberships:
        if user_id in operated:
            operated[user_id].add(tenant_id)
    if any(users[user_id].is_superuser for user_id in followers):
        every = set(Tenant.objects.values_list("pk", flat=True))
        for user_id in followers:
            if users[user_id].is_superuser:
                operated[user_id] = every
    return allowed, operated


_session_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SessionWatch] = (
    weakref.WeakKeyDictionary()
)


def session_watch() -> SessionWatch:
    return _this_loops(_session_watches, SessionWatch)
