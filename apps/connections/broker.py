"""The connection broker: turns a connectionId into a capability at execution time.

This is the only place a secret is decrypted, and the secret never leaves the
broker: tools get a client that attaches credentials itself, and the runner gets
a scrubber that takes them out of whatever the tool returns.

What a secret yields (its headers, its scrubber, its pool scope) is cached per process,
keyed by the connection, its kind, its ciphertext and the configured keys: setting or
rotating a secret, or re-encrypting it under a new key, writes a new ciphertext (Fernet
tokens never repeat), so the next call decrypts afresh; dropping a key drops the entries
it decrypted. The cache is bounded (SECRET_CACHE_SIZE, least recently used goes).
"""

from __future__ import annotations

import base64
import hashlib
import threading
import weakref
from collections import OrderedDict
from typing import Any

from apps.connections import crypto
from apps.connections.models import SECRET_VALUE_FIELDS, Connection
from apps.connections.netguard import (
    Blocked,
    BrokenResponse,
    Cancellation,
    Cancelled,
    NetworkPolicy,
    Resolver,
    fetch,
    system_resolver,
)
from apps.connections.scrubbing import Scrubber, secret_forms
from apps.tenants.epoch import EpochCache
from apps.tenants.models import Tenant
from apps.tools.contracts import ToolCancelled, ToolError

# Headers a tool may not set: the connection owns them.
RESERVED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "host"})
MAX_RESPONSE_BYTES = 16 * 1024
SECRET_CACHE_SIZE = 256

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


class Unsealed:
    """What one version of a connection's secret yields; the values stay in closures,
    not attributes a repr or vars() would show."""

    def __init__(self, connection_pk: str, kind: str, ciphertext: str) -> None:
        secret = crypto.decrypt(ciphertext) if ciphertext else {}
        auth = _auth_headers(kind, secret)
        self.credentials = lambda: auth
        self.reserved = RESERVED_HEADERS | {name.lower() for name in auth}
        self.scrubber = _scrubber(secret)
        # Pooled sockets are this secret version's alone (netguard.ConnectionPool).
        version = hashlib.sha256(ciphertext.encode()).hexdigest()[:32]
        self.pool_scope = f"{connection_pk}:{version}"

    def __repr__(self) -> str:
        return "<Unsealed>"


_unsealed: OrderedDict[tuple[str, str, str, object], Unsealed] = OrderedDict()
_unsealed_lock = threading.Lock()


def unseal(connection_pk: str, kind: str, ciphertext: str) -> Unsealed:
    """The connection's secret as the broker uses it, decrypted once per version."""
    key = (connection_pk, kind, ciphertext, crypto.keyring())
    with _unsealed_lock:
        found = _unsealed.get(key)
        if found is not None:
            _unsealed.move_to_end(key)
            return found
    made = Unsealed(connection_pk, kind, ciphertext)  # outside the lock: decryption is slow
    with _unsealed_lock:
        _unsealed[key] = made
        while len(_unsealed) > SECRET_CACHE_SIZE:
            _unsealed.popitem(last=False)
    return made


def forget_secrets() -> None:
    with _unsealed_lock:
        _unsealed.clear()


class HttpClient:
    """The `http` capability: requests through one connection, credentials attached.

    With `cancel` (the call's ToolContext), a cancelled call sends nothing more, and a
    request out when the call is cancelled is cut (netguard.fetch): ToolCancelled."""

    def __init__(self, connection: Connection, cancel: Cancellation | None = None) -> None:
        self._cancel = cancel
        unsealed = unseal(str(connection.pk), connection.kind, connection.secret_encrypted)
        self._reserved = unsealed.reserved
        self._policy = NetworkPolicy(
            allowed_hosts=list(connection.allowed_hosts),
            allow_private=connection.allow_private_network,
            resolver=resolver,
        )
        self._credentials = unsealed.credentials
        self._scrubber = unsealed.scrubber
        self._pool_scope = unsealed.pool_scope

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
                pool_scope=self._pool_scope,
                cancel=self._cancel,
            )
        except Cancelled:
            raise ToolCancelled("The call was cancelled: its request was stopped.") from None
        except (Blocked, BrokenResponse) as exc:
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


# The rows step 9 binds, per (tenant, connection id), valid while the authorization epoch
# holds: every save of a connection (its secret included), its deletion and bulk writes
# change the epoch (apps/tenants/epoch.py), so a warm call reads no connection (issue 13).
_rows = EpochCache("connection rows")


def _row(tenant: Tenant, connection_id: str) -> Connection | None:
    # No ordering: Meta's (tenant slug, name) would join the tenant table for one row.
    return _rows.get(
        (tenant.pk, connection_id),
        lambda: Connection.objects.filter(tenant=tenant, pk=connection_id).order_by().first(),
    )


def http_client(
    tenant: Tenant, connection_id: str | None, cancel: Cancellation | None = None
) -> HttpClient:
    connection = _row(tenant, connection_id) if connection_id else None
    if connection is None:  # the runner checked it; a deletion in between lands here
        raise ToolError("The connection no longer exists.")
    return HttpClient(connection, cancel)


def scrubber_of(http: object) -> Scrubber | None:
    """The scrubber of the very secret this bound http capability sends (None for no
    capability), so the runner scrubs what was sent, not the connection's secret now."""
    return http._scrubber if isinstance(http, HttpClient) else None


# The credentials a call sent outside the http capability (an MCP server's headers), by
# the call's ToolContext (its identity: the runner's own object, dropped with it).
_sent: dict[int, Scrubber] = {}
_sent_lock = threading.Lock()


def note_sent(ctx: object, unsealed: Unsealed) -> None:
    """Called before `unsealed`'s credentials leave for a call's target: the runner's step
    10b scrubs that very secret from what the call returns (sent_scrubber), even if the
    connection is rotated while the call runs."""
    key = id(ctx)
    with _sent_lock:
        noted = _sent.get(key)
        if noted is None:
            weakref.finalize(ctx, _forget_sent, key)
        _sent[key] = unsealed.scrubber if noted is None else noted | unsealed.scrubber


def _forget_sent(key: int) -> None:
    with _sent_lock:
        _sent.pop(key, None)


def sent_scrubber(ctx: object) -> Scrubber | None:
    """The scrubber of every credential noted as sent for this call (None: none was)."""
    return _sent.get(id(ctx)) if ctx is not None else None


def secret_scrubber(tenant: Tenant, connection_id: str) -> Scrubber:
    """What the runner passes a connection's tool output through: its secrets, in their
    usual encodings, become `[redacted]` (see scrubbing.py).

    Raises ToolError when the connection is gone: the output cannot be checked then.
    """
    row = (
        Connection.objects.filter(tenant=tenant, pk=connection_id)
        .order_by()
        .values_list("pk", "kind", "secret_encrypted")
        .first()
    )
    if row is None:
        raise ToolError("The connection no longer exists.")
    pk, kind, ciphertext = row
    return unseal(str(pk), kind, ciphertext).scrubber


def _scrubber(secret: dict[str, str]) -> Scrubber:
    values = [value for name, value in secret.items() if name in SECRET_VALUE_FIELDS]
    pairs = [(secret["username"], secret["password"])] if "password" in secret else []
    return Scrubber(secret_forms(values, pairs))
