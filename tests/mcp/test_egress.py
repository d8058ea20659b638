"""MCP servers over HTTP go through the address guard of `core__http_request`."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.connections import broker
from apps.connections.models import Connection
from apps.mcp.models import McpServer, McpServerCredential
from apps.mcp.sessions import Endpoint, ServerUnavailable, pool
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.mcp.test_remote_servers import serving

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]

TOKEN = "a-bearer-token-that-must-stay-home"


class Listener:
    """A TCP port on 127.0.0.1 that counts who connected and what they sent."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                self.received += conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(autouse=True)
def fresh_sessions() -> Iterator[None]:
    yield
    pool.close_all()


def add(name: str, url: str, *flags: str) -> None:
    call_command(
        "mcp_add", name, "--url", url, "--timeout-ms", "5000", *flags, stdout=io.StringIO()
    )


def sync_error(name: str) -> str:
    with pytest.raises(CommandError, match="sync failed"):
        call_command("mcp_sync", name, stdout=io.StringIO(), stderr=io.StringIO())
    return McpServer.objects.get(name=name).last_error


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.1.2.3",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "[::1]",
        "[fd00::1]",
        "[fec0::1]",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::a00:1]",
        "[2002:7f00:1::]",
    ],
)
def test_a_server_on_a_private_address_is_refused_when_registered(host: str) -> None:
    with pytest.raises(CommandError, match="only a superuser can let toolhub reach it"):
        add("priv", f"http://{host}:8080/mcp")
    assert not McpServer.objects.filter(name="priv").exists()


@pytest.mark.parametrize(
    "host",
    ["169.254.169.254", "[fe80::1]", "100.100.100.200", "[fd00:ec2::254]", "0.0.0.0"],  # noqa: S104
)
def test_link_local_metadata_and_reserved_addresses_are_refused_even_for_a_superuser(
    host: str,
) -> None:
    with pytest.raises(CommandError, match="never reaches"):
        add("meta", f"http://{host}/mcp", "--allow-private-network")
    assert not McpServer.objects.filter(name="meta").exists()


def test_a_host_name_that_resolves_to_loopback_is_never_contacted(listener: Listener) -> None:
    """`localhost` passes registration (a name), and is judged by what it resolves to."""
    add("local", f"http://localhost:{listener.port}/mcp")
    error = sync_error("local")
    assert "a private or loopback address" in error
    assert listener.accepted == 0


def test_a_credential_is_not_sent_when_the_host_is_allowed_but_its_address_is_not(
    listener: Listener,
) -> None:
    add("local", f"http://localhost:{listener.port}/mcp")
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    connection = Connection(tenant=tenant, name="mcp", kind="bearer", allowed_hosts=["localhost"])
    connection.set_secret(token=TOKEN)
    connection.save()
    server = McpServer.objects.get(name="local")
    McpServerCredential.objects.create(server=server, tenant=tenant, connection=connection)
    sync_error("local")
    assert listener.accepted == 0
    assert TOKEN.encode() not in listener.received


def test_a_name_resolving_to_a_metadata_address_is_refused_even_when_private_is_allowed(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker, "resolver", lambda host, port: ["169.254.169.254"])
    add("meta", f"http://metadata.example.test:{listener.port}/mcp", "--allow-private-network")
    assert "a cloud metadata address" in sync_error("meta")


def test_one_private_answer_among_public_ones_refuses_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(broker, "resolver", lambda host, port: ["93.184.215.14", "10.0.0.7"])
    add("mixed", "http://mixed.example.test/mcp")
    assert "a private or loopback address" in sync_error("mixed")


def test_the_socket_goes_to_the_address_that_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name exists only in the guard's resolver: had httpx resolved it again (a
    rebinding window), the connection would have failed."""
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(broker, "resolver", resolver)
    with serving(tmp_path, MCP_HTTP_HOST="calc.rebind.test:*") as url:
        port = url.split(":")[2].split("/")[0]
        add("calc", f"http://calc.rebind.test:{port}/mcp", "--allow-private-network")
        call_command("mcp_sync", "calc", stdout=io.StringIO())
    assert "calc.rebind.test" in asked
    assert Tool.objects.filter(pk__startswith="mcp__calc__").exists()


def test_an_agent_is_not_told_the_servers_host_or_address(listener: Listener) -> None:
    endpoint = Endpoint(server="local", url=f"http://localhost:{listener.port}/mcp")
    with pytest.raises(ServerUnavailable) as refused:
        pool.call_tool(endpoint, "anything", {}, timeout=5)
    message = str(refused.value)
    assert "private or loopback" in message
    assert "localhost" not in message
    assert "127.0.0.1" not in message
    assert str(listener.port) not in message


def test_a_server_registered_before_the_guard_keeps_working() -> None:
    """The migration lets existing HTTP servers (a superuser's rows) reach what they did."""
    from django.db import connection as db
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(db)
    before = [("mcp", "0002_redundant_indexes")]
    executor.migrate(before)
    old_apps = executor.loader.project_state(before).apps
    old_apps.get_model("mcp", "McpServer").objects.create(
        name="old", transport="http", url="http://10.0.0.9/mcp"
    )
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert McpServer.objects.get(name="old").allow_private_network is True
