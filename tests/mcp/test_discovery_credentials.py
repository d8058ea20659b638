"""Discovering an HTTP server that refuses even tools/list without a tenant's credential."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from apps.connections.models import Connection
from apps.mcp.discovery import sync_on_list_changed
from apps.mcp.models import McpServer, McpServerCredential
from apps.mcp.sessions import Endpoint
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.mcp.conftest import SERVERS
from tests.support.processes import stop
from tests.support.server import free_port

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "calc-secret-token"


@pytest.fixture
def locked_server() -> Iterator[McpServer]:
    """The SDK test server, answering only requests that carry `Bearer TOKEN`."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, f"{SERVERS}/http_server.py", str(port), TOKEN],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    try:
        yield McpServer.objects.create(
            name="calc",
            transport="http",
            url=f"http://127.0.0.1:{port}/mcp",
            timeout_ms=5000,
            allow_private_network=True,
        )
    finally:
        stop(process)


def credential(server: McpServer, slug: str, token: str) -> McpServerCredential:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
    connection = Connection(tenant=tenant, name="calc", kind="bearer")
    connection.allowed_hosts = ["127.0.0.1"]
    connection.set_secret(token=token)
    connection.save()
    return McpServerCredential.objects.create(server=server, tenant=tenant, connection=connection)


def sync(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("mcp_sync", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def imported() -> list[str]:
    return sorted(Tool.objects.filter(pk__startswith="mcp__calc__").values_list("pk", flat=True))


def test_it_fails_to_sync_without_credentials_saying_the_server_needs_them(locked_server):
    err = io.StringIO()
    with pytest.raises(CommandError, match="sync failed for calc"):
        call_command("mcp_sync", "calc", stdout=io.StringIO(), stderr=err)
    assert "refused the request (HTTP 401)" in err.getvalue()
    assert "--tenant" in err.getvalue()
    locked_server.refresh_from_db()
    assert "HTTP 401" in locked_server.last_error
    assert imported() == []


def test_it_imports_with_the_named_tenants_credential(locked_server):
    credential(locked_server, "acme", TOKEN)
    credential(locked_server, "globex", "a-wrong-token")
    out, _ = sync("calc", "--tenant", "acme")
    assert "listing with the credential of tenant acme" in out
    assert imported() == ["mcp__calc__add", "mcp__calc__whoami"]
    assert Tool.objects.get(pk="mcp__calc__add").enabled is False
    with pytest.raises(CommandError):
        sync("calc", "--tenant", "globex")  # that tenant's token is refused by the server


def test_it_uses_the_only_credential_and_says_so(locked_server):
    credential(locked_server, "acme", TOKEN)
    out, _ = sync("calc")
    assert "listing with the only credential, tenant acme's" in out
    assert imported() == ["mcp__calc__add", "mcp__calc__whoami"]


def test_it_refuses_to_guess_between_several_tenants_credentials(locked_server):
    credential(locked_server, "acme", TOKEN)
    credential(locked_server, "globex", TOKEN)
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("mcp_sync", "calc", stdout=io.StringIO(), stderr=err)
    message = err.getvalue()
    assert "credentials of several tenants (acme, globex)" in message
    assert "mcp_sync calc --tenant <slug>" in message
    assert imported() == []


def test_it_refuses_an_unknown_tenant_or_one_without_a_credential(locked_server):
    credential(locked_server, "acme", TOKEN)
    Tenant.objects.create(slug="initech", name="Initech")
    for slug, reason in (
        ("nosuch", "no tenant 'nosuch'"),
        ("initech", "tenant 'initech' has no credential for calc"),
    ):
        err = io.StringIO()
        with pytest.raises(CommandError):
            call_command("mcp_sync", "calc", "--tenant", slug, stdout=io.StringIO(), stderr=err)
        assert reason in err.getvalue()
    assert imported() == []
    with pytest.raises(CommandError, match="--tenant needs the name of one server"):
        sync("--tenant", "acme")


def test_the_admin_action_uses_the_only_credential_and_refuses_several(locked_server):
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-123456"))

    def run_action() -> list[str]:
        response = client.post(
            reverse("admin:mcp_mcpserver_changelist"),
            {"action": "sync", "_selected_action": [locked_server.pk]},
            follow=True,
        )
        return [str(message) for message in get_messages(response.wsgi_request)]

    credential(locked_server, "acme", TOKEN)
    credential(locked_server, "globex", TOKEN)
    [refused] = run_action()
    assert "credentials of several tenants (acme, globex)" in refused
    assert imported() == []
    McpServerCredential.objects.filter(tenant__slug="globex").delete()
    [done] = run_action()
    assert "2 new" in done and "listed with tenant acme's credential" in done
    assert imported() == ["mcp__calc__add", "mcp__calc__whoami"]


def test_a_list_changed_notice_re_syncs_with_the_credential_of_the_session_that_heard_it(
    locked_server,
):
    credential(locked_server, "acme", TOKEN)
    credential(locked_server, "globex", TOKEN)
    sync_on_list_changed(Endpoint(server="calc", url=locked_server.url, tenant="globex"))
    assert imported() == ["mcp__calc__add", "mcp__calc__whoami"]
