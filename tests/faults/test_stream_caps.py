"""The per-principal stream cap is shared by every process through Redis: a principal
cannot double it by spreading streams over processes, and the streams of a process
that died stop counting within seconds, so clients failing over are let in."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack

import pytest

from tests.conftest import allow, make_agent
from tests.streams.conftest import open_ws, refusal
from tests.support.redis import redis_server
from tests.support.server import daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]


def test_the_stream_cap_holds_across_processes_and_frees_a_dead_processs_slots(test_tools):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo")
    headers = {"Authorization": f"Bearer {agent.key}"}
    with redis_server() as redis_url, ExitStack() as streams:
        env = {"REDIS_URL": redis_url, "TOOLHUB_WS_MAX_PER_PRINCIPAL": "2"}
        with daphne(env) as a, daphne(env) as b:
            streams.enter_context(open_ws(a, "/ws/v1/runs/run-a/", headers))
            streams.enter_context(open_ws(b, "/ws/v1/runs/run-b/", headers))
            # Two processes, one cap: a third stream is refused on either.
            assert refusal(a, "/ws/v1/runs/run-c/", headers, wait=1) == 4429
            assert refusal(b, "/ws/v1/runs/run-c/", headers, wait=1) == 4429

            os.kill(a.pid, signal.SIGKILL)  # a crash: it releases nothing
            deadline = time.monotonic() + 20
            while refusal(b, "/ws/v1/runs/run-a/", headers, wait=1) != "open":
                assert time.monotonic() < deadline, "the dead process's slot never freed"
                time.sleep(0.5)
