"""WebSocket authentication: a session (browsers), `Authorization: Bearer <key or OAuth
access token>` on the handshake, or a single-use stream ticket (`?ticket=`). Sets
scope["user"], scope["api_key"] and scope["ticket"]."""

from __future__ import annotations

from importlib import import_module
from typing import Any
from urllib.parse import parse_qs, urlsplit

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from apps.oauth.bearer import key_for_credential
from apps.oauth.resource import Refusal, resource_for
from apps.tenants.models import KEY_PREFIX, ApiKey


class ApiKeyOrTicketMiddleware(BaseMiddleware):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        scope["api_key"] = None
        scope["ticket"] = None
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1").strip()
        if authorization.lower().startswith("bearer "):
            scope["api_key"] = await _key(scope, authorization[7:].strip())
            scope["bearer_given"] = True
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        if query.get("ticket"):
            scope["ticket"] = await _ticket(query["ticket"][0])
            scope["ticket_given"] = True
        return await super().__call__(scope, receive, send)


@database_sync_to_async
def _key(scope: dict[str, Any], raw: str) -> ApiKey | None:
    """An API key, or the key an OAuth access token acts through (apps.oauth); a refused
    credential is None, which the stream closes with 4403."""
    if not raw.startswith(KEY_PREFIX) and not allowed_host(scope):
        # An access token's resource (the audience it must name) follows the Host: a name
        # that is not this server's would let a token for another resource in. An API
        # key names no resource, so any Host does for it.
        return None
    host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
    try:
        resource = (
            "" if raw.startswith(KEY_PREFIX) else resource_for(scope.get("scheme", "ws"), host)
        )
        return key_for_credential(raw, resource)
    except Refusal:
        return None


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


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None if malformed."""
    try:
        parsed = urlsplit(f"{scheme}://{netloc}")
        port = parsed.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parsed.hostname or port is None or scheme not in DEFAULT_PORTS:
        return None
    return scheme, parsed.hostname, port


def allowed_origin(scope: dict[str, Any], origin: str) -> bool:
    """Django's CSRF rule for an Origin: the page's own origin, or a trusted one.

    The page's own origin is the scheme of the handshake (wss: https) with its Host,
    and only for a Host in ALLOWED_HOSTS (a rebound DNS name would otherwise be its
    own origin). Trusted origins are TOOLHUB_CSRF_TRUSTED_ORIGINS (e.g. the public
    https origin when TLS ends at a proxy), "https://*.example.com" included.
    Scheme, host and port must all match: http://host:9999 is another site.
    """
    scheme, _, netloc = origin.strip().lower().partition("://")
    given = _origin(scheme, netloc)
    if given is None or "/" in netloc:
        return False
    headers = dict(scope.get("headers") or [])
    host = headers.get(b"host", b"").decode("latin-1").lower()
    own_scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    domain, _port = split_domain_port(host)
    if domain and validate_host(domain, allowed_hosts()) and given == _origin(own_scheme, host):
        return True
    return any(_is_trusted(given, trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS)


def _is_trusted(given: tuple[str, str, int], trusted: str) -> bool:
    scheme, _, netloc = trusted.lower().partition("://")
    wildcard = netloc.startswith("*.")
    wanted = _origin(scheme, netloc[2:] if wildcard else netloc)
    if wanted is None or not wildcard:
        return given == wanted
    return (given[0], given[2]) == (wanted[0], wanted[2]) and given[1].endswith("." + wanted[1])


def allowed_host(scope: dict[str, Any]) -> bool:
    """Whether the request's Host header names this server (ALLOWED_HOSTS), as Django
    checks for its own views; ASGI apps outside Django (/mcp/) check it here."""
    headers = dict(scope.get("headers") or [])
    domain, _port = split_domain_port(headers.get(b"host", b"").decode("latin-1").lower())
    return bool(domain) and validate_host(domain, allowed_hosts())


def allowed_hosts() -> list[str]:
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        hosts = ["localhost", "127.0.0.1", "[::1]"]
    return hosts


class BrowserOriginValidator:
    """A handshake that carries an Origin must come from a page of this site (or a
    trusted origin), so no other site can open a stream with a visitor's session
    cookie; it is refused with HTTP 403. Browsers always send Origin on a WebSocket
    handshake; one without it is not a browser but an API client (Bearer key,
    ticket), which channels' AllowedHostsOriginValidator would refuse outright."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origin = dict(scope.get("headers") or []).get(b"origin")
        if origin is None or allowed_origin(scope, origin.decode("latin-1")):
            return await self.inner(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def AllowedHostsBrowserOriginValidator(inner: Any) -> BrowserOriginValidator:
    return BrowserOriginValidator(inner)
