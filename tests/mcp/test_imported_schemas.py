"""Tools of servers nobody here wrote, and of SDK servers written as people write them,
are usable as declared: synced, listed, enabled and called through the runner."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from django.core.management import call_command

from apps.invocations.models import InvocationRecord
from apps.mcp.models import McpTool
from apps.tools.wire import ROOT_REFUSED
from tests.conftest import Agent, allow, make_agent
from tests.mcp.conftest import SERVERS, add, enable
from tests.mcp.test_session_recovery import children, wait_gone

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]
GIT_TOOLS = [
    "git_add",
    "git_branch",
    "git_checkout",
    "git_commit",
    "git_create_branch",
    "git_diff",
    "git_diff_staged",
    "git_diff_unstaged",
    "git_log",
    "git_reset",
    "git_show",
    "git_status",
]


def agent_for(*tool_ids: str) -> Agent:
    enable(*tool_ids)
    agent = make_agent("acme")
    allow(agent.tenant, *tool_ids)
    return agent


def text_of(body: dict[str, Any]) -> str:
    assert body["ok"] is True, body
    return "".join(block.get("text", "") for block in body["result"]["content"])


def field_errors(agent: Agent, tool_id: str, args: dict[str, Any]) -> dict[str, str]:
    """The dry run's validation errors, field by field; the call itself is refused too."""
    answer = agent.invoke(tool_id, args=args).json()
    assert answer["errorCode"] == "validation", answer
    dry = agent.client.post(
        "/api/v1/simulations/", {"toolId": tool_id, "args": args}, format="json"
    )
    return {error["field"]: error["message"] for error in dry.json()["validationErrors"]}


def assert_providers_accept(agent: Agent, tool_id: str) -> None:
    """What OpenAI and Anthropic require of a tool's schema, in both catalog shapes."""
    openai = agent.tools(format="openai").json()["tools"]
    anthropic = agent.tools(format="anthropic").json()["tools"]
    (parameters,) = [
        t["function"]["parameters"] for t in openai if t["function"]["name"] == tool_id
    ]
    (input_schema,) = [t["input_schema"] for t in anthropic if t["name"] == tool_id]
    for schema in (parameters, input_schema):
        assert schema["type"] == "object" and isinstance(schema["properties"], dict)
        assert not set(ROOT_REFUSED) & set(schema)
        jsonschema_rs.meta.validate(schema)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A scratch git repository with one commit on `main`."""
    path = tmp_path / "repo"
    path.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (path / "README").write_text("scratch\n")
    git("add", "README")
    git("-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    return path


def test_every_tool_of_mcp_server_git_is_usable_after_a_sync(repo):
    add("git", f"mcp-server-git --repository {repo}")
    rows = McpTool.objects.filter(server__name="git").order_by("remote_name")
    assert [row.remote_name for row in rows] == GIT_TOOLS
    assert {row.remote_name: row.unusable_reason for row in rows if row.unusable_reason} == {}
    log, branch, create, status = (
        "mcp__git__git_log",
        "mcp__git__git_branch",
        "mcp__git__git_create_branch",
        "mcp__git__git_status",
    )
    agent = agent_for(log, branch, create, status)
    listed = {tool["id"] for tool in agent.tools().json()["tools"]}
    assert {log, branch, create, status} <= listed
    where = str(repo)
    assert "working tree clean" in text_of(agent.invoke(status, args={"repo_path": where}).json())
    # The optional arguments every pydantic server writes as anyOf [string, null]:
    found = text_of(
        agent.invoke(log, args={"repo_path": where, "max_count": 5, "end_timestamp": None}).json()
    )
    assert "first" in found
    found = text_of(
        agent.invoke(
            branch, args={"repo_path": where, "branch_type": "local", "contains": None}
        ).json()
    )
    assert "main" in found
    body = agent.invoke(
        create, args={"repo_path": where, "branch_name": "feature", "base_branch": None}
    ).json()
    assert "feature" in text_of(body)
    branches = subprocess.run(
        ["git", "-C", where, "branch", "--list"], check=True, capture_output=True, text=True
    ).stdout
    assert "feature" in branches
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert record.args == {"repo_path": where, "branch_name": "feature", "base_branch": None}
    assert field_errors(agent, log, {"repo_path": where, "start_timestamp": 20240115}) == {
        "start_timestamp": "the value is not valid under any of the schemas listed in the "
        '\'anyOf\' keyword (the value is not of type "string"; the value is not of type "null")'
    }
    assert_providers_accept(agent, log)


def test_a_fastmcp_servers_pydantic_arguments_are_forwarded_as_sent_across_a_restart():
    add("typed", f"python {SERVERS}/schemas.py typed")
    order, maybe = "mcp__typed__place_order", "mcp__typed__maybe"
    assert not McpTool.objects.filter(server__name="typed").exclude(unusable_reason="").exists()
    agent = agent_for(order, maybe)
    sent = {
        "customer": "ada",
        "items": [{"sku": "ABC-1", "quantity": 2}, {"sku": "XYZ-22", "quantity": 1}],
        "ship_to": {"street": "1 Main St", "city": None},
        "colour": "green",
        "speed": "fast",
        "note": None,
        "counts": {"apples": 3},
    }
    answer = json.loads(text_of(agent.invoke(order, args=sent).json()))
    assert answer["received"] == sent  # exactly as sent: the explicit nulls stay
    # The server restarts between two calls: the next call starts it again, same schemas.
    [first] = children("schemas.py")
    os.kill(first, signal.SIGKILL)
    wait_gone(first)
    answer = json.loads(text_of(agent.invoke(order, args=sent).json()))
    assert answer["received"] == sent
    assert children("schemas.py") not in ([], [first])
    assert answer["parsed"]["items"][1] == {"sku": "XYZ-22", "quantity": 1}
    assert answer["parsed"]["colour"] == "green" and answer["parsed"]["ship_to"]["city"] is None
    assert json.loads(text_of(agent.invoke(maybe, args={"text": None}).json()))["received"] == {
        "text": None
    }
    assert json.loads(text_of(agent.invoke(maybe, args={}).json()))["received"] == {}
    errors = field_errors(
        agent,
        order,
        {
            "items": [{"sku": "abc", "quantity": 0}],
            "colour": "blue",
            "speed": "warp",
            "counts": {"apples": "three"},
            "ship_to": {"city": "Paris"},
        },
    )
    assert set(errors) == {
        "customer",
        "items.0.sku",
        "items.0.quantity",
        "colour",
        "speed",
        "counts",
        "ship_to",
    }
    assert errors["items.0.quantity"] == "the value is less than the minimum of 1"
    assert errors["colour"] == 'the value is not one of "red" or "green"'
    assert '"street" is a required property' in errors["ship_to"]
    assert_providers_accept(agent, order)


def test_one_schema_that_cannot_be_used_leaves_the_rest_of_the_sync_usable():
    out = io.StringIO()
    call_command("mcp_add", "decl", "--command", f"python {SERVERS}/schemas.py declared")
    call_command("mcp_sync", "decl", stdout=out)
    reasons = {
        row.remote_name: row.unusable_reason
        for row in McpTool.objects.filter(server__name="decl").select_related("tool")
    }
    assert reasons["tagged"] == reasons["plain"] == ""
    assert reasons["dangling"].startswith("the input schema of 'dangling' cannot be used: ")
    assert "/$defs/Missing" in reasons["dangling"]
    assert reasons["bad_pattern"] == (
        "the input schema of 'bad_pattern' cannot be used: $.properties.v.pattern: "
        '"(a" is not a "regex"'
    )
    assert "never fetches" in reasons["remote"]
    assert "CONNECTION_ID_VIA_CONTEXT" in reasons["with_connection"]
    for name in ("dangling", "bad_pattern", "remote", "with_connection"):
        assert f"mcp__decl__{name} is unusable: the input schema of '{name}'" in out.getvalue()
    tagged, plain, dangling = "mcp__decl__tagged", "mcp__decl__plain", "mcp__decl__dangling"
    agent = agent_for(tagged, plain, dangling)
    assert agent.invoke(dangling, args={}).json()["errorCode"] == "unavailable"  # even enabled
    assert json.loads(text_of(agent.invoke(plain, args={"value": 1}).json()))["received"] == {
        "value": 1
    }
    sent = {"kind": "point", "at": [1, 2.5], "labels": {"x-a": "b"}, "size": "small"}
    assert json.loads(text_of(agent.invoke(tagged, args=sent).json()))["received"] == sent
    errors = field_errors(
        agent,
        tagged,
        {"kind": "line", "at": [1, "2", 3], "labels": {"y": "b"}, "size": 1.5},
    )
    assert errors == {
        "kind": '"point" was expected',
        "at.1": 'the value is not of type "number"',
        "at.2": "False schema does not allow the value",
        "labels.y": "is not an argument the schema declares (additionalProperties is false)",
        "size": "the value is not valid under any of the schemas listed in the 'oneOf' keyword "
        '(the value is not of type "integer"; the value is not one of "small" or "large")',
    }
    spec = next(t for t in agent.tools().json()["tools"] if t["id"] == tagged)
    assert spec["inputSchema"]["properties"]["kind"] == {"const": "point"}  # kept as declared
    assert spec["inputSchema"]["properties"]["when"]["format"] == "date-time"
    assert spec["inputSchema"]["definitions"] == {"Named": {"enum": ["small", "large"]}}
    assert_providers_accept(agent, tagged)


def test_a_tool_whose_input_schema_is_empty_takes_any_object():
    add("bare", f"python {SERVERS}/schemas.py bare")
    anything, plain = "mcp__bare__anything", "mcp__bare__plain"
    rows = McpTool.objects.filter(server__name="bare")
    assert {row.remote_name: row.unusable_reason for row in rows} == {"anything": "", "plain": ""}
    agent = agent_for(anything, plain)
    sent = {"free": [1, None, {"form": True}]}
    assert json.loads(text_of(agent.invoke(anything, args=sent).json()))["received"] == sent
    assert_providers_accept(agent, anything)
