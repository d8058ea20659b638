"""Issue 46: the agent-loop example (clients/python/examples/agent_loop.py) run as a
newcomer runs it, a subprocess against a real Daphne: it finds toolhub on $TOOLHUB_PORT,
makes a held call and says so while it waits for an operator's decision, and a wrong
port is one clear line, not a traceback."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.invocations.models import InvocationRecord, Status
from tests.conftest import CORE_TOOLS, Agent, allow, make_agent
from tests.streams.conftest import logged_in, operator
from tests.support.processes import stop
from tests.support.server import Server, daphne, free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "python"
EXAMPLE = CLIENT / "examples" / "agent_loop.py"
EMAIL = "core__send_email"
HELD_LINE = re.compile(r"^call_email \(core__send_email\) is held for approval (\S+): ")


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne({"TOOLHUB_EMBEDDED_WORKER": "1"}) as base:  # runs the approved call
        yield base


@pytest.fixture
def demo(transactional_db: None) -> Agent:
    """As in `make run`'s demo: the built-in tools, the email among them."""
    agent = make_agent("demo", "agent:demo")
    allow(agent.tenant, *CORE_TOOLS, EMAIL)
    return agent


def example(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(CLIENT), "PATH": "", **(env or {})},
    )


def lines_of(stream: object) -> queue.Queue[str]:
    """The stream's lines as they come, read in a thread (a test never blocks on it)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_the_example_waits_for_the_held_email_until_an_operator_decides(server, demo, decision):
    olga = operator("olga", demo.tenant, decide=(EMAIL,))
    process = example("--key", demo.key, "--stream", env={"TOOLHUB_PORT": str(server.port)})
    try:
        stderr = lines_of(process.stderr)
        notice = stderr.get(timeout=60)
        found = HELD_LINE.match(notice)
        assert found, notice
        assert f"{server}/console/" in notice and notice.rstrip().endswith("Waiting...")
        # The example is waiting on the run's stream; nothing has ended yet.
        assert process.poll() is None
        record = InvocationRecord.objects.get(tenant=demo.tenant, tool_id=EMAIL)
        assert record.status == Status.PENDING_APPROVAL
        logged_in(server, olga).decide(found.group(1), decision, "not to Bob")
        stdout, rest = process.communicate(timeout=60)
    finally:
        stop(process)
    assert process.returncode == 0, rest
    transcript = [json.loads(line) for line in stdout.splitlines()]
    assert [m["role"] for m in transcript] == ["user", "assistant", *["tool"] * 4, "assistant"]
    answer = transcript[-1]["content"]
    assert "In UTC it is" in answer and "The plan is started." in answer
    record.refresh_from_db()
    if decision == "approve":
        assert "Bob has been told." in answer
        assert record.status == Status.SUCCEEDED
    else:
        assert "A tool failed: not to Bob" in answer
        assert record.status == Status.FAILED


def test_a_wrong_port_is_one_clear_line_and_a_failure_exit(transactional_db):
    port = free_port()  # nothing listens there
    process = example("--key", "th_any", env={"TOOLHUB_PORT": str(port)})
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stdout == ""
    assert "Traceback" not in stderr
    [line] = stderr.splitlines()
    assert line.startswith(f"agent_loop.py: cannot reach toolhub at http://127.0.0.1:{port} (")
    assert "--toolhub or TOOLHUB_PORT" in line


def test_help_explains_where_toolhub_is_looked_for():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(CLIENT), "PATH": "", "TOOLHUB_PORT": "8123"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--toolhub URL toolhub's base URL" in text
    assert "$TOOLHUB_PORT" in text and "now http://127.0.0.1:8123" in text
