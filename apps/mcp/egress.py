"""MCP over HTTP through the same address guard as `core__http_request` (netguard).

The SDK's HTTP client (httpx2 on httpcore2) connects wherever a URL's host resolves to.
Here every TCP connection it opens goes through `GuardedBackend.connect_tcp`: the host
is resolved once, every address it resolves to must pass `netguard.address_problem`
(link-local and cloud-metadata addresses never; private and loopback ones only on a
server a superuser allowed them for), and the socket connects to the very address that
was checked, so a second DNS answer cannot swap it (no rebinding between check and use).
TLS is still verified against the host name: httpcore passes the URL's host as the
server name when it wraps the socket.

Since the check runs before a socket exists, nothing of a request (its credential
headers included) leaves for an address the server may not reach. Proxies from the
environment are ignored (`trust_env=False`): a proxy would connect on our behalf and
skip the check.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2._backends.auto import AutoBackend
from httpx2._config import DEFAULT_LIMITS, create_ssl_context

from apps.connections import broker
from apps.connections.netguard import Blocked, IPAddress, address_problem


class AddressRefused(Exception):
    """The server's host resolves to an address this server may not reach."""


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's default backend, connecting only to checked addresses."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private
        self.inner = AutoBackend()

    def _checked(self, host: str, port: int) -> str:
        """The address to connect to: every address `host` resolves to must pass, the
        first is used. The reasons name no host or address (they may reach an agent)."""
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        try:
            # broker.resolver: the one tests swap to make a name resolve to an address.
            addresses = [str(literal)] if literal else broker.resolver(host, port)
        except Blocked:
            raise AddressRefused("its host name could not be resolved") from None
        if not addresses:
            raise AddressRefused("its host name has no address")
        for address in addresses:
            problem = address_problem(ipaddress.ip_address(address), self.allow_private)
            if problem:
                raise AddressRefused(f"its address is {problem}, which toolhub may not reach")
        return addresses[0]

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        # Resolution blocks (getaddrinfo): off the sessions' loop.
        address = await asyncio.to_thread(self._checked, host, port)
        return await self.inner.connect_tcp(
            address,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.AsyncNetworkStream:
        raise AddressRefused("MCP servers are reached over TCP only.")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_transport(allow_private: bool) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport with its pool built on GuardedBackend (its settings otherwise)."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=create_ssl_context(trust_env=False),
        max_connections=DEFAULT_LIMITS.max_connections,
        max_keepalive_connections=DEFAULT_LIMITS.max_keepalive_connections,
        keepalive_expiry=DEFAULT_LIMITS.keepalive_expiry,
        network_backend=GuardedBackend(allow_private),
    )
    return transport
