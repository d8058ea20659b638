"""WebSocket authentication: a session (browsers), `Authorization: Bearer <key>` on the
handshake, or a single-use stream ticket (`?ticket=`). Sets scope["user"],
scope["api_key"] and scope["ticket"]."""

from __future__ import annotations

from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator
from channels.sessions import CookieMiddleware
from django.conf import settings

from apps.tenants.models import ApiKey


class ApiKeyOrTicketMiddleware(BaseMiddleware):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        scope["api_key"] = None
        scope["ticket"] = None
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1").strip()
        if authorization.lower().startswith("bearer "):
            scope["api_key"] = await _key(authorization[7:].strip())
            scope["bearer_given"] = True
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        if query.get("ticket"):
            scope["ticket"] = await _ticket(query["ticket"][0])
            scope["ticket_given"] = True
        return await super().__call__(scope, receive, send)


@database_sync_to_async
def _key(raw: str) -> ApiKey | None:
    return ApiKey.objects.for_raw_key(raw)


@database_sync_to_async
def _ticket(raw: str) -> Any:
    from apps.invocations.models import StreamTicket

    return StreamTicket.objects.redeem(raw)


class ReadOnlySessionMiddleware(BaseMiddleware):
    """The visitor's session, for streams, which only read it (to find the staff user).

    Channels' SessionMiddleware also wraps `send` so that it can save a changed
    session on accept; that wrapper inspects the session on every frame sent, about a
    fifth of what handing one event to a stream costs. Nothing here changes the
    session, so `send` is passed through untouched.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        store = import_module(settings.SESSION_ENGINE).SessionStore
        scope["session"] = store(scope["cookies"].get(settings.SESSION_COOKIE_NAME))
        return await super().__call__(scope, receive, send)


def WebSocketAuthStack(inner: Any) -> Any:
    return CookieMiddleware(
        ReadOnlySessionMiddleware(AuthMiddleware(ApiKeyOrTicketMiddleware(inner)))
    )


class BrowserOriginValidator(OriginValidator):
    """A handshake that carries an Origin must come from a page of an allowed host, so
    no other site can open a stream with a visitor's session cookie. Browsers always
    send Origin on a WebSocket handshake; one without it is not a browser but an API
    client (Bearer key, ticket), which channels' AllowedHostsOriginValidator would
    refuse outright."""

    def valid_origin(self, parsed_origin: Any) -> bool:
        return parsed_origin is None or bool(super().valid_origin(parsed_origin))


def AllowedHostsBrowserOriginValidator(inner: Any) -> BrowserOriginValidator:
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(inner, allowed_hosts)
