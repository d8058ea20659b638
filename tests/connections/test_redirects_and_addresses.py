"""Credentials stay on their origin across redirects; IPv6 addresses that carry an IPv4
address are judged by the address they carry.

Redirect tests use two real servers on 127.0.0.1 (two ports: two origins). Address tests
call the judging function directly: no traffic leaves the loopback interface.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from apps.connections import broker, netguard
from tests.conftest import Agent, allow
from tests.connections import HTTP, LocalServer, local_server, make_connection, usable
from tests.support.responses import failure, ok_result

# Not about the database: one leg of the gate (tests/conftest.py).
pytestmark = pytest.mark.one_leg

TOKEN = "SECRET-redirect-bearer-81d2c4"
CREDENTIALS = {
    "bearer": ({"token": TOKEN}, "authorization"),
    "basic": ({"username": "robot", "password": "SECRET-redirect-basic-77"}, "authorization"),
    "api_key": ({"header_name": "X-Api-Key", "value": "SECRET-redirect-key-3a"}, "x-api-key"),
}


@pytest.fixture
def first() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


@pytest.fixture
def second() -> Iterator[LocalServer]:
    with local_server() as running:
        yield running


def connect(agent: Agent, kind: str = "bearer", hosts: tuple[str, ...] = ("127.0.0.1",)) -> str:
    allow(agent.tenant, HTTP, name="http")
    secret, _ = CREDENTIALS[kind]
    connection = make_connection(
        agent.tenant, name=f"hop-{kind}", kind=kind, hosts=hosts, private=True, **secret
    )
    return str(usable(connection, agent.principal).pk)


def redirect(server: LocalServer, to: str) -> str:
    return f"{server.base}/redirect?to={quote(to, safe='')}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["bearer", "basic", "api_key"])
def test_a_redirect_to_another_port_arrives_without_the_credential(agent, first, second, kind):
    connection_id = connect(agent, kind)
    response = agent.invoke(
        HTTP, args={"url": redirect(first, f"{second.base}/ok/there")}, connectionId=connection_id
    )
    assert ok_result(response)["url"] == f"{second.base}/ok/there"
    _, header = CREDENTIALS[kind]
    (asked,) = first.seen
    (landed,) = second.seen
    assert header in asked.headers
    assert header not in landed.headers
    assert "authorization" not in landed.headers and "cookie" not in landed.headers
    assert landed.headers["user-agent"] == "toolhub/1"  # the other headers still go


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["bearer", "api_key"])
def test_a_redirect_on_the_same_origin_keeps_the_credential(agent, first, kind):
    connection_id = connect(agent, kind)
    response = agent.invoke(
        HTTP, args={"url": redirect(first, f"{first.base}/ok/here")}, connectionId=connection_id
    )
    assert ok_result(response)["status"] == 200
    _, header = CREDENTIALS[kind]
    assert [header in seen.headers for seen in first.seen] == [True, True]


@pytest.mark.django_db(transaction=True)
def test_a_credential_dropped_on_leaving_the_origin_is_not_restored_on_coming_back(
    agent, first, second
):
    connection_id = connect(agent)
    back = redirect(second, f"{first.base}/ok/back")
    response = agent.invoke(HTTP, args={"url": redirect(first, back)}, connectionId=connection_id)
    assert ok_result(response)["url"] == f"{first.base}/ok/back"
    assert [seen.path for seen in first.seen][-1] == "/ok/back"
    assert [("authorization" in seen.headers) for seen in first.seen] == [True, False]
    assert "authorization" not in second.seen[0].headers


@pytest.mark.django_db(transaction=True)
def test_a_redirect_to_another_allowed_host_name_arrives_without_the_credential(
    agent, first, monkeypatch
):
    # Same address and port, another host name: another origin.
    monkeypatch.setattr(broker, "resolver", lambda host, port: ["127.0.0.1"])
    connection_id = connect(agent, hosts=("127.0.0.1", "localhost"))
    port = first.server_address[1]
    response = agent.invoke(
        HTTP,
        args={"url": redirect(first, f"http://localhost:{port}/ok/named")},
        connectionId=connection_id,
    )
    assert ok_result(response)["status"] == 200
    assert [("authorization" in seen.headers) for seen in first.seen] == [True, False]


@pytest.mark.django_db(transaction=True)
def test_a_redirect_to_a_port_of_a_host_outside_allowed_hosts_is_refused(agent, first, second):
    connection_id = connect(agent)
    port = second.server_address[1]
    response = agent.invoke(
        HTTP,
        args={"url": redirect(first, f"http://localhost:{port}/ok")},
        connectionId=connection_id,
    )
    code, message = failure(response)
    assert code == "execution"
    assert "does not allow requests to 'localhost'" in message
    assert second.seen == []


def test_the_origin_counts_the_default_port_and_ignores_case():
    assert netguard._origin("http://API.example.com/a") == netguard._origin(
        "http://api.example.com:80/b"
    )
    assert netguard._origin("http://api.example.com/") != netguard._origin(
        "https://api.example.com/"
    )


# ---------------------------------------------------------------- embedded IPv4 addresses


def judge(address: str, allow_private: bool = False) -> str | None:
    return netguard.address_problem(ipaddress.ip_address(address), allow_private=allow_private)


def teredo(server: str, client: str) -> str:
    """A Teredo address (RFC 4380): 2001:0::/32, the server, flags and port, then the
    client's IPv4 address XOR 0xffffffff."""
    value = (0x20010000 << 96) | (int(ipaddress.IPv4Address(server)) << 64)
    value |= int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    return str(ipaddress.IPv6Address(value))


def nat64_48(ipv4: str) -> str:
    """64:ff9b:1::/48 with the RFC 6052 /48 layout: bits 48-63 and 72-87."""
    v4 = int(ipaddress.IPv4Address(ipv4))
    value = (0x0064FF9B0001 << 80) | ((v4 >> 16) << 64) | ((v4 & 0xFFFF) << 40)
    return str(ipaddress.IPv6Address(value))


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("::ffff:10.0.0.1", "a private or loopback address"),  # IPv4-mapped
        ("::ffff:0:10.0.0.1", "a private or loopback address"),  # IPv4-translated (SIIT)
        ("::127.0.0.1", "a private or loopback address"),  # IPv4-compatible
        ("::169.254.169.254", "a cloud metadata address"),
        ("2002:7f00:0001::", "a private or loopback address"),  # 6to4 of 127.0.0.1
        ("2002:0a00:0001:1234::1", "a private or loopback address"),
        ("2002:a9fe:a9fe::", "a cloud metadata address"),
        ("64:ff9b::127.0.0.1", "a private or loopback address"),  # NAT64
        ("64:ff9b::10.1.2.3", "a private or loopback address"),
        ("64:ff9b::169.254.169.254", "a cloud metadata address"),
        ("64:ff9b:1::a9fe:a9fe", "a reserved address"),  # local-use: /48 reads 0.0.0.0
        (nat64_48("192.168.0.1"), "a private or loopback address"),  # local-use, /48
        (teredo("8.8.8.8", "10.0.0.1"), "a private or loopback address"),
        (teredo("8.8.8.8", "169.254.169.254"), "a cloud metadata address"),
        (teredo("127.0.0.1", "8.8.8.8"), "a private or loopback address"),
        ("fec0::1", "a private or loopback address"),  # site-local
        ("fef0::1", "a private or loopback address"),
    ],
)
def test_an_embedded_non_public_ipv4_address_is_refused(address, problem):
    assert judge(address) == problem


@pytest.mark.parametrize(
    "address",
    [
        "2002:a9fe:a9fe::",
        "64:ff9b::169.254.169.254",
        teredo("8.8.8.8", "169.254.169.254"),
        "::ffff:0:169.254.1.1",
        "2002:a9fe:0101::",
    ],
)
def test_an_embedded_metadata_or_link_local_address_is_refused_even_with_private_networks(
    address,
):
    assert judge(address, allow_private=True) is not None


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("::ffff:8.8.8.8", "8.8.8.8"),
        ("::ffff:0:8.8.8.8", "8.8.8.8"),
        ("::8.8.8.8", "8.8.8.8"),
        ("2002:0808:0808::1", "8.8.8.8"),
        ("64:ff9b::8.8.8.8", "8.8.8.8"),
        ("64:ff9b::1.1.1.1", "1.1.1.1"),
        (teredo("1.1.1.1", "8.8.8.8"), "8.8.8.8"),
    ],
)
def test_an_embedded_public_ipv4_address_is_judged_as_that_address(address, embedded):
    assert ipaddress.IPv4Address(embedded) in netguard.embedded_ipv4(ipaddress.IPv6Address(address))
    assert judge(address) is None
    assert judge(address) == judge(embedded)


def test_the_teredo_client_is_read_through_its_xor():
    # RFC 4380's own example: server 65.54.227.120, cone flag, port 40000, client 192.0.2.45.
    address = ipaddress.IPv6Address("2001:0000:4136:e378:8000:63bf:3fff:fdd2")
    assert netguard.embedded_ipv4(address) == [
        ipaddress.IPv4Address("65.54.227.120"),
        ipaddress.IPv4Address("192.0.2.45"),
    ]


def test_a_local_use_nat64_address_is_refused_if_any_prefix_layout_reads_a_private_address():
    # The /48 layout reads 192.168.0.1; the /96 layout reads something else.
    address = ipaddress.IPv6Address(nat64_48("192.168.0.1"))
    carried = netguard.embedded_ipv4(address)
    assert ipaddress.IPv4Address("192.168.0.1") in carried
    assert len(carried) == len(netguard.NAT64_LAYOUTS)


@pytest.mark.parametrize(("address", "allowed"), [("::1", True), ("::", False)])
def test_loopback_and_unspecified_ipv6_are_not_read_as_ipv4(address, allowed):
    assert netguard.embedded_ipv4(ipaddress.IPv6Address(address)) == []
    assert (judge(address, allow_private=True) is None) is allowed
