"""The Python client and the agent-loop example against a real Daphne."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
from toolhub_client import Toolhub, ToolhubError

from apps.invocations.models import InvocationRecord, Status
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.streams.conftest import logged_in, operator
from tests.support.server import Server, daphne
from tests.wire.conftest import CLIENT

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]

EXAMPLE = CLIENT / "examples" / "agent_loop.py"


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne() as base:
        yield base


@pytest.fixture
def demo(test_tools: list[str]) -> Agent:
    """Like `make run`'s demo tenant: the built-in tools, plus the test tools."""
    agent = make_agent("demo", "agent:demo")
    allow(agent.tenant, *CORE_TOOLS, "test__echo", "test__confirm")
    return agent


def call(call_id: str, name: str, arguments: str) -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("stream", [False, True])
def test_the_agent_loop_example_gets_its_answer_from_toolhubs_tools(server, demo, stream):
    loop = example()
    with loop.scripted_model() as model_url:
        messages = loop.agent_loop(Toolhub(server, demo.key), model_url, stream=stream)

    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [m["tool_call_id"] for m in messages[2:5]] == ["call_utc", "call_tokyo", "call_plan"]
    answer = messages[-1]["content"]
    assert "In UTC it is" in answer and "In Asia/Tokyo it is" in answer
    assert "The plan is started." in answer
    records = InvocationRecord.objects.filter(tenant=demo.tenant)
    assert records.count() == 3 and len({r.run_id for r in records}) == 1
    assert {r.status for r in records} == {Status.SUCCEEDED}


def test_the_example_runs_as_the_readme_shows(server, demo):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--toolhub", server, "--key", demo.key, "--stream"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(CLIENT), "PATH": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["role"] == "assistant" and "In UTC it is" in last["content"]


def test_the_client_waits_for_a_held_call_over_the_run_stream(server, demo):
    olga = operator("olga", demo.tenant, decide=("test__confirm",))
    browser = logged_in(server, olga)
    client = Toolhub(server, demo.key)
    calls = [call("c_ok", "test__echo", '{"text": "a"}'), call("c_held", "test__confirm", "{}")]
    batch = client.run_openai_tool_calls(calls)
    [held] = batch.held
    assert held.tool_call_id == "c_held" and batch.results[0].value == {"text": "a"}

    def reject_later() -> None:
        time.sleep(1.0)  # the client is already waiting on the stream by then
        browser.decide(held.held.approval_id, "reject", "not today")

    rejecter = threading.Thread(target=reject_later)
    rejecter.start()
    started = time.monotonic()
    messages = client.settle_openai(batch, timeout=30)
    rejecter.join()

    assert time.monotonic() - started >= 0.9
    assert messages[0] == batch.messages[0]
    final = json.loads(messages[1]["content"])
    assert final["errorCode"] == "approval_rejected" and final["safeMessage"] == "not today"
    assert final["invocationId"] == held.held.invocation_id


def test_the_client_speaks_anthropic_too(server, demo):
    client = Toolhub(server, demo.key)
    tools = client.tools(format="anthropic")
    assert {"name", "description", "input_schema"} == set(tools[0])
    content = [{"type": "tool_use", "id": "toolu_1", "name": "test__echo", "input": {"text": "b"}}]
    batch = client.run_anthropic_tool_use(content, run_id="run-client-anthropic")
    assert batch.message["role"] == "user"
    [result] = batch.results
    assert result.value == {"text": "b"} and not result.is_error
    assert client.settle_anthropic(batch) == batch.message
    assert InvocationRecord.objects.get(tool_call_id="toolu_1").run_id == "run-client-anthropic"


def test_the_client_raises_on_a_refused_request(server, demo):
    with pytest.raises(ToolhubError) as exc:
        Toolhub(server, demo.key).run_openai_tool_calls([])
    assert exc.value.status == 400
    with pytest.raises(ToolhubError) as exc:
        Toolhub(server, "th_wrong").tools()
    assert exc.value.status == 401


def test_the_client_starts_a_run_narrowed_to_some_tools(server, demo):
    client = Toolhub(server, demo.key)
    run_id = client.start_run(["test__echo"])
    assert [tool["id"] for tool in client.tools(run_id=run_id)] == ["test__echo"]
    assert [t["function"]["name"] for t in client.tools("openai", run_id)] == ["test__echo"]
    batch = client.run_openai_tool_calls([call("c1", "test__confirm", "{}")], run_id=run_id)
    assert "policy_denied" in batch.messages[0]["content"]
    with pytest.raises(ToolhubError) as exc:
        client.start_run(["test__confirm"], run_id=run_id)
    assert exc.value.status == 409


# ---------------------------------------------------------------- retryAfterMs


def _flaky_args(tmp_path, hint: int) -> dict:
    return {"path": str(tmp_path / "f.log"), "token": "t", "failures": 1, "retry_after_ms": hint}


def test_invoke_waits_out_an_unavailable_calls_retry_after_and_sends_it_again(
    server, demo, tmp_path
):
    allow(demo.tenant, "test__flaky")
    client = Toolhub(server, demo.key)

    call = client.invoke("test__flaky", _flaky_args(tmp_path, 50), idempotency_key="f-1")

    assert call.ok is True and call.result["executions"] == 2
    assert call.retry_of is not None  # the failed attempt, linked by toolhub


def test_invoke_does_not_wait_past_its_bound_or_when_turned_off(server, demo, tmp_path):
    allow(demo.tenant, "test__flaky")

    huge = Toolhub(server, demo.key).invoke("test__flaky", _flaky_args(tmp_path, 10**9))
    off = Toolhub(server, demo.key, max_retries=0).invoke(
        "test__flaky", {**_flaky_args(tmp_path, 50), "token": "u"}
    )

    assert (huge.ok, huge.error_code, huge.retry_after_ms) == (False, "unavailable", 3_600_000)
    assert (off.ok, off.error_code, off.retry_after_ms) == (False, "unavailable", 50)
