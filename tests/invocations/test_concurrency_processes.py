"""A concurrency limit holds across processes: two Daphne processes on one PostgreSQL
database serve one tenant, and a tool with max_concurrency=1 runs one call at a time
whichever process takes it (the slots are rows: apps/invocations/concurrency.py)."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import allow, make_agent
from tests.streams.conftest import KeyClient
from tests.support import held_tools
from tests.support.server import daphne

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server,
    pytest.mark.one_leg("postgresql"),
]

TOOL = "test__held"
ENV = {
    "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools,tests.support.held_tools",
    "TOOLHUB_CONCURRENCY_WAIT_S": "1",  # the bound a call over the limit waits
}


@pytest.fixture(autouse=True)
def _postgresql_only(db: None) -> None:
    if connection.vendor == "sqlite":
        pytest.skip(
            "limits shared by processes need a database several processes write at once: "
            "run on PostgreSQL (scripts/test --with-postgres .venv/bin/pytest "
            "tests/invocations/test_concurrency_processes.py)"
        )


@pytest.fixture
def held_tool() -> Iterator[str]:
    for contract in held_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
    Tool.objects.sync_registry(registry)
    yield TOOL
    for contract in held_tools.CONTRACTS:
        registry.unregister(contract.id)
    Tool.objects.sync_registry(registry)


@pytest.fixture
def barrier() -> Iterator[tuple[socket.socket, str]]:
    """A listening Unix socket the held tool connects to (a short path: AF_UNIX's limit)."""
    folder = Path(tempfile.mkdtemp(prefix="th-"))
    path = str(folder / "b")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    listener.settimeout(30)
    yield listener, path
    listener.close()
    Path(path).unlink(missing_ok=True)
    folder.rmdir()


def test_a_call_through_one_process_holds_the_slot_for_the_other(held_tool, barrier):
    listener, path = barrier
    agent = make_agent("acme")
    allow(agent.tenant, TOOL)
    Tool.objects.filter(pk=TOOL).update(max_concurrency=1)

    with daphne(ENV) as a, daphne(ENV) as b:
        first: list[dict[str, Any]] = []
        holder = threading.Thread(
            target=lambda: first.append(
                KeyClient(a, agent.key).invoke(TOOL, args={"socket": path}, runId="run-a")
            )
        )
        holder.start()
        inside, _ = listener.accept()  # A's call is in the tool, holding the slot
        try:
            assert inside.recv(3) == b"in\n"
            refused = KeyClient(b, agent.key).invoke(TOOL, args={"socket": path}, runId="run-b")
        finally:
            inside.sendall(b"go")  # A's call leaves
            inside.close()
        holder.join(30)

        # B waited its bound for the slot A held, then was refused with a hint.
        assert refused["ok"] is False and refused["errorCode"] == "rate_limited", refused
        assert refused["safeMessage"].startswith("Concurrency limit reached"), refused
        assert refused["retryAfterMs"] > 0, refused
        assert first and first[0]["ok"] is True, first

        # A gave the slot back: B's next call gets it.
        again: list[dict[str, Any]] = []
        caller = threading.Thread(
            target=lambda: again.append(
                KeyClient(b, agent.key).invoke(TOOL, args={"socket": path}, runId="run-b2")
            )
        )
        caller.start()
        inside, _ = listener.accept()
        with inside:
            assert inside.recv(3) == b"in\n"
            inside.sendall(b"go")
        caller.join(30)
        assert again and again[0]["ok"] is True, again
