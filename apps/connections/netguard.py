"""Outbound HTTP that cannot be steered into the private network (SSRF guard).

Addresses are checked after DNS resolution, the socket connects to the very
address that was checked (so a second DNS answer cannot swap it), and every
redirect hop goes through the same checks. A cancelled call's request stops: it is
checked before each hop's resolution and before its socket opens, and a cancellation
while the request is out shuts its socket down, so the server sees the connection close
and nothing is sent again (`cancel`, Cancelled). Link-local and cloud-metadata
addresses are refused always; private and loopback ones unless the connection
explicitly allows them. An IPv6 address that carries an IPv4 address (mapped,
compatible, 6to4, Teredo, NAT64) is judged by the IPv4 address it carries, since
that is where the packet ends up. Credentials are sent only while the request
stays on the origin (scheme, host, port) it started on, as browsers do.

Keep-alive connections are reused (issue 13: a new TCP, and TLS, connection per call
cost more than the call). A pooled connection is only ever reused for the same scope
(the broker's: one connection's credential version), the same credentialed-or-not
state, and the same scheme, host, port and checked address; the address check runs
on every request before the pool is asked, so a reused socket never reaches an
address this request's policy refuses. See ConnectionPool for when a socket goes back.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urljoin, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")
# Deprecated (RFC 3879) but still routed by some networks: as private as fc00::/7.
SITE_LOCAL = ipaddress.ip_network("fec0::/10")
IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT, RFC 2765
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated, RFC 4291
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052
NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215
# Where RFC 6052 puts the IPv4 address for each NAT64 prefix length a /48 may hold:
# (prefix length, [(first bit, bit count), ...]); bits 64-71 are the zero "u" octet.
NAT64_LAYOUTS = (
    (48, ((48, 16), (72, 16))),
    (56, ((56, 8), (72, 24))),
    (64, ((72, 32),)),
    (96, ((96, 32),)),
)
MAX_REDIRECTS = 5
# Headers that carry credentials: never sent to another origin after a redirect.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
# Methods a client may retry once when a reused keep-alive connection turns out closed
# (RFC 9110 9.2.2); the others only ever go out on a fresh connection.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})
POOL_MAX_IDLE = 32  # idle sockets kept per process, all scopes together
POOL_IDLE_S = 15.0  # an idle socket older than this is closed, not reused
# Built once: loading the system CA store costs milliseconds, and one context may be
# shared by every connection (it holds settings, not per-connection state).
TLS_CONTEXT = ssl.create_default_context()


PRIVATE = "a private or loopback address"  # the one problem a superuser may waive


class Blocked(Exception):
    """The request would reach a host or address the connection does not allow."""


class BrokenResponse(Exception):
    """The server's answer is not a whole HTTP response: not HTTP at all, or a body that
    stopped before the length it announced (a chunked body cut short included)."""


class Cancelled(Exception):
    """The call was cancelled: the request was not sent, or was cut while it ran."""


class Cancellation(Protocol):
    """What fetch watches (a tool call's ToolContext): whether the call is cancelled,
    and a callback when it becomes so."""

    @property
    def cancelled(self) -> bool: ...

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]: ...


class _Cut:
    """Shuts the socket of the request in flight down when the call is cancelled: a
    blocked send or read on the tool's thread then ends at once (shutdown, not close:
    the descriptor stays valid for the thread that uses it)."""

    def __init__(self) -> None:
        self.done = False
        self.connection: http.client.HTTPConnection | None = None
        # The request's socket, kept apart: http.client lets go of a connection's socket
        # (connection.sock = None) once a response that closes it arrives, while the body
        # is still read from it.
        self.sock: socket.socket | None = None

    def __call__(self) -> None:
        self.done = True
        _shut(self.sock)
        connection = self.connection
        if connection is not None:
            _shut(connection.sock)

    def watch(self, connection: http.client.HTTPConnection) -> None:
        self.connection = connection
        if self.done:
            raise Cancelled

    def hold(self, sock: socket.socket | None) -> None:
        """The socket the request went out on (its response is read from it)."""
        self.sock = sock
        if self.done:
            _shut(sock)


def _shut(sock: socket.socket | None) -> None:
    if sock is None:
        return
    # socket's own shutdown, even for TLS: SSLSocket.shutdown would also drop the TLS
    # state another thread is reading with. OSError: already closed.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise Blocked(f"The host {host!r} could not be resolved.") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _bits(ip: ipaddress.IPv6Address, first: int, count: int) -> int:
    return (int(ip) >> (128 - first - count)) & ((1 << count) - 1)


def _nat64_embedded(ip: ipaddress.IPv6Address, layout: tuple[tuple[int, int], ...]) -> int:
    value = 0
    for first, count in layout:
        value = (value << count) | _bits(ip, first, count)
    return value


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries; a packet to it ends up at one of them.

    Teredo carries two (the server, and the client obfuscated by XOR with all ones);
    a local-use NAT64 prefix may be any length up to /96, so every layout is read.
    """
    if ip in IPV4_MAPPED or ip in IPV4_TRANSLATED:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)  # (server, client); Python undoes the client's XOR
    if ip in NAT64_WELL_KNOWN:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip in NAT64_LOCAL_USE:
        return [ipaddress.IPv4Address(_nat64_embedded(ip, layout)) for _, layout in NAT64_LAYOUTS]
    if ip in IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 are themselves, not IPv4
        return [ipaddress.IPv4Address(int(ip))]
    return []


def address_problem(ip: IPAddress, allow_private: bool) -> str | None:
    """Why `ip` may not be connected to, or None. Embedded IPv4 addresses are judged instead."""
    if isinstance(ip, ipaddress.IPv6Address):
        carried = embedded_ipv4(ip)
        if carried:
            problems = (address_problem(inner, allow_private) for inner in carried)
            return next((problem for problem in problems if problem), None)
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    # ::1 lies in ::/8, which Python counts as reserved: loopback is judged below, as private.
    if ip.is_multicast or ip.is_unspecified or (ip.is_reserved and not ip.is_loopback):
        return "a reserved address"
    private = ip.is_loopback or ip.is_private or ip in SHARED_ADDRESS_SPACE or ip in SITE_LOCAL
    if private and not allow_private:
        return PRIVATE
    return None


def host_allowed(host: str, patterns: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for pattern in patterns:
        pattern = pattern.lower().rstrip(".")
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and host != pattern[2:]:
                return True
        elif host == pattern.strip("[]") or host == pattern:
            return True
    return False


@dataclass(frozen=True)
class NetworkPolicy:
    allowed_hosts: list[str]
    allow_private: bool = False
    resolver: Resolver = field(default=system_resolver)

    def check_host(self, host: str) -> None:
        if not host_allowed(host, self.allowed_hosts):
            raise Blocked(f"The connection does not allow requests to {host!r}.")

    def safe_address(self, host: str, port: int) -> str:
        """Resolve `host`; every address must pass, and the first one is used."""
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        addresses = [str(literal)] if literal else self.resolver(host, port)
        if not addresses:
            raise Blocked(f"The host {host!r} has no address.")
        for address in addresses:
            problem = address_problem(ipaddress.ip_address(address), self.allow_private)
            if problem:
                raise Blocked(f"The host {host!r} resolves to {problem}, which is not allowed.")
        return addresses[0]


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to `address`, which the caller checked, never to what `host` resolves to
    by then (a second DNS answer cannot swap it); `host` still names the Host header."""

    cut: _Cut | None = None  # the request's, when its call can be cancelled

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as http.client does
        return sock

    def connect(self) -> None:
        self.sock = self._open()
        self._cut_if_cancelled()

    def _cut_if_cancelled(self) -> None:
        """A cancellation that came while the socket was connecting found none to shut."""
        if self.cut is not None and self.cut.done:
            _shut(self.sock)


class _PinnedHTTPS(_PinnedHTTP, http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        http.client.HTTPSConnection.__init__(self, host, port, timeout=timeout, context=TLS_CONTEXT)
        self.address = address

    def connect(self) -> None:
        # The certificate is checked against the host name, as without pinning.
        self.sock = TLS_CONTEXT.wrap_socket(self._open(), server_hostname=self.host)
        self._cut_if_cancelled()


# (scope, credentialed, scheme, host, port, checked address)
PoolKey = tuple[str, bool, str, str, int, str]


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """True when an idle socket was closed by the server or holds bytes nobody asked for."""
    sock = connection.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    # poll(), not select() (descriptors may pass 1024) nor a selector (epoll's would be a
    # descriptor of its own and three more system calls per reuse: issue 13).
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class ConnectionPool:
    """Idle keep-alive connections, bounded, each reused only under its exact key.

    A connection goes back only after a response that was read to its end and did not
    announce a close, with no error on the way; anything else closes it. Before reuse,
    one that sat idle too long, or that the server closed (or wrote to unasked), is
    closed instead. Sockets carry no state of ours beyond the key, which names the
    broker's scope (one connection's credential version): one connection's socket,
    and whatever a server bound to it, never serves another connection's request.
    """

    def __init__(self, max_idle: int = POOL_MAX_IDLE, idle_s: float = POOL_IDLE_S) -> None:
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: deque[tuple[PoolKey, float, http.client.HTTPConnection]] = deque()

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, key: PoolKey) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                found = next((entry for entry in reversed(self._idle) if entry[0] == key), None)
                if found is None:
                    return None
                self._idle.remove(found)
            _, since, connection = found
            if time.monotonic() - since <= self.idle_s and not _dropped(connection):
                return connection
            connection.close()

    def give_back(self, key: PoolKey, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((key, time.monotonic(), connection))
            evicted = self._idle.popleft() if len(self._idle) > self.max_idle else None
        if evicted is not None:
            evicted[2].close()

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for _, _, connection in idle:
            connection.close()


POOL = ConnectionPool()


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool
    url: str


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    default_port = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default_port


def fetch(
    policy: NetworkPolicy,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    credentials: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 10.0,
    max_bytes: int = 16 * 1024,
    pool_scope: str | None = None,
    follow_redirects: bool = True,
    cancel: Cancellation | None = None,
) -> Response:
    """Send one request, following redirects, each hop re-checked (without
    `follow_redirects`, a redirect is returned as the answer).

    `credentials` (headers) go only to the origin the request started on: once a
    redirect leaves it (another scheme, host or port), they and any credential-shaped
    header are dropped for good, even if a later hop comes back.

    With a `pool_scope`, keep-alive connections of POOL under that scope are reused
    and returned; without one, every hop has a connection of its own.

    With `cancel`, a cancelled call raises Cancelled before the next hop's resolution or
    socket, and a cancellation while a request is out cuts it (_Cut).
    """
    cut = _Cut()
    forget = cancel.on_cancel(cut) if cancel is not None else None
    try:
        return _fetch(
            policy,
            method,
            url,
            headers,
            credentials,
            body,
            timeout,
            max_bytes,
            pool_scope,
            follow_redirects,
            cut,
        )
    except Cancelled:
        raise
    except Exception:
        if cut.done:  # whatever the cut socket raised: the cause is the cancellation
            raise Cancelled from None
        raise
    finally:
        if forget is not None:
            forget()


def _fetch(
    policy: NetworkPolicy,
    method: str,
    url: str,
    headers: Mapping[str, str],
    credentials: Mapping[str, str] | None,
    body: bytes | None,
    timeout: float,
    max_bytes: int,
    pool_scope: str | None,
    follow_redirects: bool,
    cut: _Cut,
) -> Response:
    origin = _origin(url)
    sent = {**headers, **(credentials or {})}
    credentialed = bool(credentials)
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Blocked("Only absolute http and https URLs can be requested.")
        if parts.username or parts.password:
            raise Blocked("URLs may not carry credentials.")
        host = parts.hostname
        policy.check_host(host)
        if _origin(url) != origin:
            secret_names = CREDENTIAL_HEADERS | {name.lower() for name in credentials or {}}
            sent = {k: v for k, v in sent.items() if k.lower() not in secret_names}
            credentialed = False
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if cut.done:
            raise Cancelled
        address = policy.safe_address(host, port)  # every hop, before any socket
        if cut.done:  # cancelled while the name resolved: no socket opens
            raise Cancelled
        key: PoolKey = (pool_scope or "", credentialed, parts.scheme, host, port, address)
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        try:
            connection, response = _exchange(
                key,
                method,
                target,
                body,
                sent,
                timeout,
                POOL if pool_scope is not None else None,
                cut,
            )
        except http.client.HTTPException as exc:
            if isinstance(exc, OSError):  # RemoteDisconnected: closed without an answer
                raise
            raise BrokenResponse("The remote server's answer is not valid HTTP.") from None
        reusable = False
        try:
            location = response.getheader("Location")
            if follow_redirects and response.status in (301, 302, 303, 307, 308) and location:
                _read(response, max_bytes)
                reusable = _finished(connection, response)
                url = urljoin(url, location)
                if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                    method, body = "GET", None
                continue
            data = _read(response, max_bytes + 1)
            if len(data) <= max_bytes and response.length:
                # http.client's read(amt) returns what came before the close, silently.
                raise BrokenResponse(
                    f"The remote server closed the connection after {len(data)} of the "
                    f"{len(data) + response.length} bytes it announced."
                )
            reusable = _finished(connection, response)
            return Response(
                status=response.status,
                headers={k.lower(): v for k, v in response.getheaders()},
                body=data[:max_bytes],
                truncated=len(data) > max_bytes,
                url=url,
            )
        finally:
            if reusable and pool_scope is not None:
                POOL.give_back(key, connection)
            else:
                connection.close()
    raise Blocked(f"Too many redirects (more than {MAX_REDIRECTS}).")


def _exchange(
    key: PoolKey,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: float,
    pool: ConnectionPool | None,
    cut: _Cut,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send the request and read the response's head, on a pooled connection when one
    is idle under `key` and the method may be retried: a server may close an idle
    connection just as it is reused, and only then is the request sent again, once,
    on a fresh connection. Other methods always get a fresh connection. A cancelled
    request is never sent again (`cut.watch` raises Cancelled)."""
    reused = pool.take(key) if pool is not None and method in IDEMPOTENT_METHODS else None
    if reused is not None:
        reused.timeout = timeout
        if reused.sock is not None:
            reused.sock.settimeout(timeout)
        try:
            cut.watch(reused)
            return reused, _send(reused, method, target, body, headers, cut)
        except ConnectionError:  # reset, broken pipe, or closed before a status line
            reused.close()
        except BaseException:
            reused.close()
            raise
    _, _, scheme, host, port, address = key
    connection_class = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    connection = connection_class(host, port, address, timeout)
    connection.cut = cut
    try:
        cut.watch(connection)
        return connection, _send(connection, method, target, body, headers, cut)
    except BaseException:
        connection.close()
        raise


def _send(
    connection: http.client.HTTPConnection,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    cut: _Cut | None = None,
) -> http.client.HTTPResponse:
    connection.request(method, target, body=body, headers=dict(headers))
    if cut is not None:
        cut.hold(connection.sock)
    return connection.getresponse()


def _read(response: http.client.HTTPResponse, amount: int) -> bytes:
    try:
        return response.read(amount)
    except http.client.IncompleteRead as exc:  # a chunked body cut short
        raise BrokenResponse(
            f"The remote server closed the connection after {len(exc.partial)} bytes, "
            "in the middle of its answer."
        ) from None
    except http.client.HTTPException:
        raise BrokenResponse("The remote server's answer is not valid HTTP.") from None


def _finished(connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> bool:
    """Whether the connection may serve another request: the response was read to its
    end and did not announce a close (http.client then drops the socket itself)."""
    return (
        response.isclosed()
        and not response.will_close
        and not response.length  # a body cut short (the server closed) is not an end
        and connection.sock is not None
    )
