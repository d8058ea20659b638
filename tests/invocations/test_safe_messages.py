"""What an agent reads about a failed call names nothing of the deployment (docs/security.md).

A `safeMessage` reaches the model and whoever reads its transcript: the REST answer, the
run's events and the dry run's reasons are read here (the MCP and wire-format results carry
the same words). It says what the caller can act on; the setting that refused, the file,
the host of a server staff configured and the other tenants stay in the server's log and
the admin. Each case makes one kind of call fail for real and reads every message an
agent gets about it.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from django.db import connection as database

from apps.connections.models import Connection
from apps.invocations.models import RunEvent
from apps.mcp.discovery import apply_to_catalog
from apps.mcp.models import McpServer, McpServerCredential, McpTool, tool_hash
from apps.mcp.sessions import pool
from apps.tools.models import Source, Tool
from tests.conftest import Agent, allow
from tests.connections import HTTP, make_connection, usable
from tests.support.server import free_port

pytestmark = pytest.mark.django_db(transaction=True)

UNLISTED = "test__where"  # registered, in none of acme's policies
# Words that name configuration rather than say what to do: settings, and the
# management commands only staff can run.
CONFIGURATION = re.compile(
    r"\bTOOLHUB_[A-Z0-9_]+|\bDATABASE_URL\b|\bREDIS_URL\b|\bDJANGO_[A-Z_]+|"
    r"\bmanage\.py\b|\bmcp_(?:sync|add)\b"
)
# An absolute file-system path ("at /srv/app.py", "'/usr/bin/x'"); not a URL's "//host/",
# nor toolhub's own API ("GET /api/v1/tools/ lists the tools": a direction to the agent).
ABSOLUTE_PATH = re.compile(r"(?:^|[\s'\"(\[=])/(?!api/v1/)[\w.@-]+/")


@dataclass
class World:
    """An agent of `acme` that may call the built-in and test tools, and `globex` beside it.

    `banned` grows with what a case configures (a server's URL, a command): texts of the
    deployment that no message to the agent may contain."""

    agent: Agent
    other: Agent
    banned: list[str] = field(default_factory=list)

    def call(self, tool_id: str, **body: Any) -> list[str]:
        """The call's failure as the agent reads it: the answer, the run's result event,
        and the dry run of the same request."""
        answer = self.agent.invoke(tool_id, **body).json()
        assert answer.get("ok") is False, answer
        events = RunEvent.objects.filter(
            tenant=self.agent.tenant, run_id=answer["runId"], type="tool_call_result"
        )
        simulated = self.agent.client.post(
            "/api/v1/simulations/", {"toolId": tool_id, **body}, format="json"
        ).json()
        return [
            answer["safeMessage"],
            *(event.message.get("safeMessage", "") for event in events),
            simulated.get("safeMessage", ""),
            *simulated.get("reasons", []),
            *(error["message"] for error in simulated.get("validationErrors", [])),
        ]


@pytest.fixture
def world(agent: Agent, stranger: Agent, test_tools: list[str]) -> Iterator[World]:
    allow(agent.tenant, *(t for t in test_tools if t != UNLISTED), HTTP, name="tests")
    db = database.settings_dict
    deployment = [str(settings.BASE_DIR), str(settings.VAR_DIR), sys.prefix]
    deployment += [str(value) for value in (db.get("NAME"), db.get("HOST")) if value]
    other_connection = make_connection(stranger.tenant, "globex-ledger")
    deployment += [stranger.tenant.slug, stranger.tenant.name, other_connection.name]
    yield World(agent=agent, other=stranger, banned=deployment)
    pool.close_all()


def leaks(text: str, banned: list[str]) -> list[str]:
    found = [match.group(0) for match in CONFIGURATION.finditer(text)]
    found += [match.group(0).strip() for match in ABSOLUTE_PATH.finditer(text)]
    return found + [item for item in banned if item and item in text]


# ---------------------------------------------------------------- the cases


def unknown_tool(world: World) -> list[str]:
    return world.call("core__no_such_tool")


def tool_no_policy_allows(world: World) -> list[str]:
    return world.call(UNLISTED)


def arguments_that_are_not_json(world: World) -> list[str]:
    return world.call("core__get_current_time", arguments="{not json")


def arguments_the_schema_refuses(world: World) -> list[str]:
    return world.call("core__get_current_time", args={"timezone": 5, "extra": True})


def a_crash_whose_exception_names_a_file(world: World) -> list[str]:
    world.banned.append("hunter2")
    return world.call("test__crash")  # RuntimeError("... password=hunter2 at /srv/app.py ...")


def a_tool_that_refuses(world: World) -> list[str]:
    return world.call("test__refuse")


def a_tool_that_times_out(world: World) -> list[str]:
    return world.call("test__sleep", args={"seconds": 2})


def output_that_is_not_the_declared_one(world: World) -> list[str]:
    return world.call("test__wrong_output")


def a_plan_that_does_not_exist(world: World) -> list[str]:
    return world.call("core__planning_read_plan")


def another_tenants_connection(world: World) -> list[str]:
    theirs = Connection.objects.get(tenant=world.other.tenant)
    url = "https://api.example.com/"
    return world.call(HTTP, args={"url": url}, connectionId=str(theirs.pk))


def a_target_that_refuses_the_connection(world: World) -> list[str]:
    port = free_port()
    ours = usable(make_connection(world.agent.tenant, "local", hosts=("127.0.0.1",), private=True))
    return world.call(HTTP, args={"url": f"http://127.0.0.1:{port}/"}, connectionId=str(ours.pk))


def a_secret_no_configured_key_decrypts(world: World) -> list[str]:
    ours = usable(make_connection(world.agent.tenant, "broken"))
    Connection.objects.filter(pk=ours.pk).update(secret_encrypted="not-a-fernet-token")
    url = "https://api.example.com/"
    return world.call(HTTP, args={"url": url}, connectionId=str(ours.pk))


def imported_tool(world: World, server: McpServer) -> str:
    """An enabled tool of `server`, as discovery would import it (without asking it)."""
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    tool_id = f"mcp__{server.name}__whoami"
    row = McpTool(
        server=server,
        remote_name="whoami",
        tool=Tool(id=tool_id, enabled=True, source=Source.MCP),
        description="Says who is asking.",
        input_schema=schema,
        accepted_hash=tool_hash("Says who is asking.", schema),
    )
    apply_to_catalog(row)
    allow(world.agent.tenant, tool_id, name="mcp")
    return tool_id


def an_mcp_command_off_the_allowlist(world: World) -> list[str]:
    command = "/opt/mcp/bin/mcp-server-time --local-timezone UTC"
    server = McpServer.objects.create(name="clock", transport="stdio", command=command)
    world.banned += [command, "mcp-server-time"]
    return world.call(imported_tool(world, server))


def an_mcp_server_the_credential_may_not_reach(world: World) -> list[str]:
    url = f"http://127.0.0.1:{free_port()}/internal/mcp"
    server = McpServer.objects.create(name="calc", transport="http", url=url)
    ours = make_connection(world.agent.tenant, "calc", hosts=("api.example.com",))
    McpServerCredential.objects.create(server=server, tenant=world.agent.tenant, connection=ours)
    world.banned += [url, "127.0.0.1", "/internal/mcp"]
    return world.call(imported_tool(world, server))


def an_mcp_server_that_is_down(world: World) -> list[str]:
    url = f"http://127.0.0.1:{free_port()}/internal/mcp"
    server = McpServer.objects.create(
        name="calc", transport="http", url=url, timeout_ms=3000, allow_private_network=True
    )
    world.banned += [url, "127.0.0.1", "/internal/mcp"]
    return world.call(imported_tool(world, server))


class _Refusing(BaseHTTPRequestHandler):
    """An HTTP server that wants credentials nobody sent: 401 to everything."""

    def do_POST(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Bearer realm="calc"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_DELETE = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def refusing_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/internal/mcp"
    finally:
        server.shutdown()
        server.server_close()


def an_mcp_server_that_wants_credentials_the_tenant_lacks(world: World) -> list[str]:
    with refusing_server() as url:
        server = McpServer.objects.create(
            name="calc", transport="http", url=url, allow_private_network=True
        )
        theirs = make_connection(world.other.tenant, "calc", hosts=("127.0.0.1",))
        McpServerCredential.objects.create(
            server=server, tenant=world.other.tenant, connection=theirs
        )
        world.banned += [url, "127.0.0.1", "/internal/mcp"]
        return world.call(imported_tool(world, server))


CASES: list[Any] = [
    unknown_tool,
    tool_no_policy_allows,
    arguments_that_are_not_json,
    arguments_the_schema_refuses,
    a_crash_whose_exception_names_a_file,
    a_tool_that_refuses,
    a_tool_that_times_out,
    output_that_is_not_the_declared_one,
    a_plan_that_does_not_exist,
    another_tenants_connection,
    a_target_that_refuses_the_connection,
    a_secret_no_configured_key_decrypts,
    an_mcp_server_that_is_down,
    an_mcp_command_off_the_allowlist,
    an_mcp_server_the_credential_may_not_reach,
    an_mcp_server_that_wants_credentials_the_tenant_lacks,
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_no_message_about_a_failed_call_names_the_deployment(
    world: World, case: Callable[[World], list[str]]
) -> None:
    messages = [text for text in case(world) if text]
    assert messages, "the case produced no message to check"
    found = {text: leaks(text, world.banned) for text in messages}
    assert not {text: what for text, what in found.items() if what}
