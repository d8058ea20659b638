"""Servers that change under toolhub, hang at start, or are cancelled mid-call."""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import CommandError, call_command

from apps.invocations.models import InvocationRecord
from apps.mcp import sessions
from apps.mcp.models import McpServer
from apps.tools.models import Tool
from tests.conftest import allow, make_agent
from tests.mcp.conftest import SERVERS, add, enable
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_leg]


def test_a_tool_removed_between_list_and_call_gives_a_clear_error():
    add("v", f"python {SERVERS}/misbehaving.py vanish")
    enable("mcp__v__ghost", "mcp__v__remove_ghost")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__v__ghost", "mcp__v__remove_ghost")
    assert agent.invoke("mcp__v__remove_ghost").json()["ok"] is True
    body = agent.invoke("mcp__v__ghost").json()
    assert body["ok"] is False and body["errorCode"] == "execution", body
    assert body["safeMessage"].startswith("v/ghost: ")


def test_a_tool_announced_later_by_list_changed_is_imported_disabled():
    add("g", f"python {SERVERS}/misbehaving.py grow")
    enable("mcp__g__grow")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__g__grow")
    assert agent.invoke("mcp__g__grow").json()["ok"] is True
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not Tool.objects.filter(pk="mcp__g__extra").exists():
        time.sleep(0.2)
    extra = Tool.objects.get(pk="mcp__g__extra")
    assert (extra.enabled, extra.effect) == (False, "external_side_effect")


def test_a_server_that_never_initialises_fails_the_sync_within_its_start_timeout(monkeypatch):
    monkeypatch.setattr(sessions, "START_S", 1.5)  # start-up has its own bound, not timeout_ms
    call_command(
        "mcp_add", "slow", "--command", f"python {SERVERS}/misbehaving.py hang_start",
        "--timeout-ms", "1500", stdout=io.StringIO(),
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(CommandError):
        call_command("mcp_sync", "slow", stdout=io.StringIO(), stderr=io.StringIO())
    assert time.monotonic() - started < 5
    assert "the server did not start within 1.5 s" in McpServer.objects.get(name="slow").last_error


def test_a_running_call_is_cancelled_on_request():
    add("bad", f"python {SERVERS}/misbehaving.py well", timeout_ms=20000)
    enable("mcp__bad__nap", "mcp__bad__echo")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__bad__nap", "mcp__bad__echo")
    answers: list[dict[str, object]] = []
    worker = threading.Thread(
        target=in_thread(
            lambda: answers.append(
                agent.invoke("mcp__bad__nap", args={"seconds": 30}, runId="run-nap").json()
            )
        )
    )
    worker.start()
    deadline = time.monotonic() + 10
    running = InvocationRecord.objects.none()
    while time.monotonic() < deadline:
        running = InvocationRecord.objects.filter(run_id="run-nap", status="running")
        if running.exists():
            break
        time.sleep(0.1)
    running.update(cancel_requested=True)
    worker.join(10)
    assert answers and answers[0]["errorCode"] == "cancelled", answers
    assert agent.invoke("mcp__bad__echo", args={"text": "still here"}).json()["ok"] is True


def test_a_stdio_server_gets_none_of_toolhubs_secrets_in_its_environment(monkeypatch):
    monkeypatch.setenv("TOOLHUB_SECRET_KEY", "must-not-leak-0123456789abcdefghijklmnopqrstuvwxyz")
    add("env", f"python {SERVERS}/misbehaving.py env")
    enable("mcp__env__env_names")
    agent = make_agent("acme")
    allow(agent.tenant, "mcp__env__env_names")
    body = agent.invoke("mcp__env__env_names").json()
    names = body["result"]["structuredContent"]["result"]
    assert "PATH" in names
    assert not [name for name in names if "TOOLHUB" in name or "DATABASE" in name]


def test_deleting_a_server_retires_its_tools_from_the_catalog():
    add("bad", f"python {SERVERS}/misbehaving.py well")
    enable("mcp__bad__echo")
    McpServer.objects.get(name="bad").delete()
    echo = Tool.objects.get(pk="mcp__bad__echo")
    assert (echo.enabled, echo.available) == (False, False)
