"""The connection broker: turns a connectionId into a capability at execution time.

This is the only place a secret is decrypted, and the secret never leaves the
broker: tools get a client that attaches credentials itself, and the runner gets
a scrubber that takes them out of whatever the tool returns.
"""

from __future__ import annotations

import base64
from typing import Any

from apps.connections.models import SECRET_VALUE_FIELDS, Connection
from apps.connections.netguard import Blocked, NetworkPolicy, Resolver, fetch, system_resolver
from apps.connections.scrubbing import Scrubber, secret_forms
from apps.tenants.models import Tenant
from apps.tools.contracts import ToolError

# Headers a tool may not set: the connection owns them.
RESERVED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "host"})
MAX_RESPONSE_BYTES = 16 * 1024

# Swappable in tests that need a host name to resolve to a chosen address.
resolver: Resolver = system_resolver


def _auth_headers(kind: str, secret: dict[str, str]) -> dict[str, str]:
    if kind == Connection.Kind.API_KEY:
        return {secret["header_name"]: secret["value"]}
    if kind == Connection.Kind.BEARER:
        return {"Authorization": f"Bearer {secret['token']}"}
    if kind == Connection.Kind.BASIC:
        pair = f"{secret['username']}:{secret['password']}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    if kind == Connection.Kind.OAUTH:
        return {"Authorization": f"Bearer {secret['access_token']}"}
    raise ValueError(f"unknown connection kind {kind!r}")


class HttpClient:
    """The `http` capability: requests through one connection, credentials attached."""

    def __init__(self, connection: Connection) -> None:
        auth = _auth_headers(connection.kind, connection.read_secret())
        self._reserved = RESERVED_HEADERS | {name.lower() for name in auth}
        self._policy = NetworkPolicy(
            allowed_hosts=list(connection.allowed_hosts),
            allow_private=connection.allow_private_network,
            resolver=resolver,
        )
        self._credentials = lambda: auth  # a closure: not an attribute a repr or vars() shows
        self._scrubber = _scrubber(connection)

    def __repr__(self) -> str:
        return "<HttpClient>"  # never the credentials

    def request(
        self, method: str, url: str, headers: dict[str, str], body: str | None, timeout: float
    ) -> dict[str, Any]:
        clash = sorted(name for name in headers if name.lower() in self._reserved)
        if clash:
            raise ToolError(
                f"The header(s) {', '.join(clash)} are set by the connection, not by the tool."
            )
        try:
            response = fetch(
                self._policy,
                method,
                url,
                headers={**headers, "User-Agent": "toolhub/1"},
                credentials=self._credentials(),
                body=body.encode() if body is not None else None,
                timeout=timeout,
                max_bytes=MAX_RESPONSE_BYTES,
            )
        except Blocked as exc:
            raise ToolError(str(exc)) from None
        except TimeoutError:
            raise ToolError("The remote server did not answer in time.") from None
        except OSError as exc:
            raise ToolError(f"The request failed: {type(exc).__name__}.") from None
        except ValueError:
            # http.client quotes the offending header value (the credential, or a tool's
            # argument) in its message: never let it reach a log or a result.
            raise ToolError(
                "The request could not be sent: a header or the URL is malformed."
            ) from None
        body = response.body.decode("utf-8", errors="replace")
        return {
            "status": response.status,
            "content_type": response.headers.get("content-type", ""),
            "body": self._scrubber.cut_tail(body) if response.truncated else body,
            "truncated": response.truncated,
            "url": response.url,
        }


def http_client(tenant: Tenant, connection_id: str | None) -> HttpClient:
    connection = (
        Connection.objects.filter(tenant=tenant, pk=connection_id).first()
        if connection_id
        else None
    )
    if connection is None:  # the runner checked it; a deletion in between lands here
        raise ToolError("The connection no longer exists.")
    return HttpClient(connection)


def secret_scrubber(tenant: Tenant, connection_id: str) -> Scrubber:
    """What the runner passes a connection's tool output through: its secrets, in their
    usual encodings, become `[redacted]` (see scrubbing.py).

    Raises ToolError when the connection is gone: the output cannot be checked then.
    """
    connection = Connection.objects.filter(tenant=tenant, pk=connection_id).first()
    if connection is None:
        raise ToolError("The connection no longer exists.")
    return _scrubber(connection)


def _scrubber(connection: Connection) -> Scrubber:
    secret = connection.read_secret()
    values = [value for name, value in secret.items() if name in SECRET_VALUE_FIELDS]
    pairs = [(secret["username"], secret["password"])] if "password" in secret else []
    return Scrubber(secret_forms(values, pairs))
