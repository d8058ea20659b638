"""What an HTTP MCP server declares while listed with a tenant's credential is scrubbed of
that credential before it becomes catalog text (every tenant's users, the model, the
admin and the logs read the catalog): descriptions, schemas, annotations and error
messages; a tool named with it, or with it in a property name, is not imported."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from apps.mcp.discovery import SyncFailed, sync_on_list_changed, sync_server
from apps.mcp.models import McpServer, McpTool
from apps.mcp.sessions import Endpoint
from apps.tools.models import Tool
from tests.mcp.conftest import SERVERS
from tests.mcp.test_discovery_credentials import credential
from tests.support.processes import stop
from tests.support.server import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]
TOKEN = "leaky-listing-token-5d1e"


def start(port: int, *, leaky: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, **({"MCP_HTTP_LEAKY_LISTING": "1"} if leaky else {})}
    process = subprocess.Popen(
        [sys.executable, f"{SERVERS}/http_server.py", str(port), TOKEN],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    stop(process)
    raise RuntimeError("the MCP test server did not start")


@pytest.fixture
def leaky() -> Iterator[McpServer]:
    port = free_port()
    process = start(port, leaky=True)
    try:
        server = McpServer.objects.create(
            name="leaky",
            transport="http",
            url=f"http://127.0.0.1:{port}/mcp",
            timeout_ms=5000,
            allow_private_network=True,
        )
        credential(server, "acme", TOKEN)
        yield server
    finally:
        stop(process)


def catalog_text() -> str:
    """Every text the sync wrote that a reader of the catalog or the admin sees."""
    rows = [
        [tool.id, tool.name, tool.description, tool.input_schema, tool.output_schema]
        for tool in Tool.objects.filter(pk__startswith="mcp__leaky__")
    ]
    mirrors = [
        [row.remote_name, row.description, row.input_schema, row.annotations]
        for row in McpTool.objects.filter(server__name="leaky")
    ]
    server = McpServer.objects.get(name="leaky")
    return json.dumps([rows, mirrors, server.last_error])


def leaks(text: str) -> list[str]:
    header = f"Bearer {TOKEN}"
    forms = [TOKEN, base64.b64encode(header.encode()).decode(), TOKEN.replace("-", "_")]
    return [form for form in forms if form.lower() in text.lower()]


def test_a_servers_listing_is_scrubbed_of_the_credential_it_was_listed_with(leaky):
    out, err = io.StringIO(), io.StringIO()
    call_command("mcp_sync", "leaky", "--tenant", "acme", stdout=out, stderr=err)

    text = catalog_text()
    assert leaks(text + out.getvalue() + err.getvalue()) == []
    described = {row.remote_name: row for row in McpTool.objects.filter(server__name="leaky")}
    assert described["leaky_description"].description == "Send Bearer [redacted] when calling."
    # base64 of "Bearer <token>": the token's part goes ("Bearer " keeps its own prefix).
    assert "[redacted]" in described["leaky_encoded"].description
    schema = described["leaky_schema"].input_schema
    assert schema["properties"]["note"]["default"] == "[redacted]"
    assert "[redacted]" in schema["properties"]["note"]["description"]
    assert schema["properties"]["mode"]["enum"] == ["plain", "with-token"]  # no secret
    assert described["leaky_title"].annotations["title"] == "Title [redacted]"
    assert described["leaky_title"].annotations["readOnlyHint"] is True
    # The tool's own title is kept (for /mcp/ clients) beside its hints, scrubbed too.
    assert described["leaky_tool_title"].annotations["title"] == "Shown as [redacted]"
    # The tool named with the token: not imported, and the report does not repeat its name.
    assert not [name for name in described if name.startswith("tool_")]
    assert "a tool whose name contains the listing credential is not imported" in (
        McpServer.objects.get(name="leaky").last_error
    )
    # Tools that quote nothing come through as the server declared them.
    assert described["add"].description == "Add two integers."
    assert set(described["add"].input_schema["properties"]) == {"a", "b"}


def test_a_scrubbed_schema_still_makes_a_usable_contract(leaky):
    sync_server(leaky, tenant="acme")
    tool = Tool.objects.get(pk="mcp__leaky__leaky_schema")
    assert tool.schema_hash and not McpTool.objects.get(tool=tool).unusable_reason
    assert leaks(json.dumps(tool.input_schema)) == []


def test_the_re_sync_on_list_changed_scrubs_as_the_sync_does(leaky):
    sync_on_list_changed(Endpoint(server="leaky", url=leaky.url, tenant="acme"))
    assert McpTool.objects.filter(server__name="leaky").exists()
    assert leaks(catalog_text()) == []


def test_a_pending_change_shown_to_the_admin_is_scrubbed_too(leaky):
    sync_server(leaky, tenant="acme")
    row = McpTool.objects.get(server__name="leaky", remote_name="leaky_description")
    row.accepted_hash = "an older declaration"
    row.save()
    sync_server(leaky, tenant="acme")
    row.refresh_from_db()
    assert row.has_pending_change
    assert row.pending_description == "Send Bearer [redacted] when calling."
    assert leaks(catalog_text() + json.dumps(row.pending_input_schema)) == []


def test_a_listing_error_quoting_the_credential_is_scrubbed(leaky, monkeypatch):
    from apps.mcp import discovery
    from apps.mcp.sessions import RemoteError

    def quoting(endpoint, timeout):
        headers = dict(endpoint.headers)
        raise RemoteError(f"the server refused {headers['Authorization']}")

    monkeypatch.setattr(discovery.pool, "list_tools", quoting)
    with pytest.raises(SyncFailed) as failed:
        sync_server(leaky, tenant="acme")
    assert leaks(str(failed.value) + catalog_text()) == []
    assert "Bearer [redacted]" in McpServer.objects.get(name="leaky").last_error


def test_a_property_name_holding_the_credential_keeps_the_tool_out(leaky, monkeypatch):
    from apps.mcp import discovery

    real = discovery.pool.list_tools

    def renamed(endpoint, timeout):
        listed = real(endpoint, timeout=timeout)
        for tool in listed:
            if tool.name == "add":
                tool.input_schema["properties"][f"x_{TOKEN}"] = {"type": "string"}
        return listed

    monkeypatch.setattr(discovery.pool, "list_tools", renamed)
    report = sync_server(leaky, tenant="acme")
    assert "mcp__leaky__add" not in report.created
    assert any("property names contain the listing credential" in e for e in report.errors)
    assert leaks(catalog_text()) == []
