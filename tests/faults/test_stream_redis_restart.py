"""A Redis restart during a burst of one run's events (issue 47): the restarted Redis has
forgotten every group and every message in flight, and pushes fail while it is down. The
streams must still end with every event of the run, once each and in order: their feeds
join again and they re-read what they missed from the database."""

from __future__ import annotations

import json
import threading
from contextlib import ExitStack

import pytest

from tests.conftest import allow, make_agent
from tests.streams.conftest import KeyClient, open_ws
from tests.support.redis import redis_server
from tests.support.server import daphne, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

CALLS = 30  # two events each
RESTART_AFTER = 10


def test_streams_resume_with_nothing_lost_when_redis_restarts_during_a_burst(test_tools):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo")
    headers = {"Authorization": f"Bearer {agent.key}"}
    port = free_port()
    with ExitStack() as redis, ExitStack() as streams:
        url = redis.enter_context(redis_server(port))
        with daphne({"REDIS_URL": url}) as server:
            opened = [
                streams.enter_context(open_ws(server, "/ws/v1/runs/run-burst/", headers))
                for _ in range(3)
            ]
            client = KeyClient(server, agent.key)
            halfway = threading.Event()
            failures: list[BaseException] = []

            def burst() -> None:
                try:
                    for n in range(CALLS):
                        client.invoke("test__echo", args={"text": str(n)}, runId="run-burst")
                        if n == RESTART_AFTER:
                            halfway.set()
                except BaseException as error:  # reported below
                    failures.append(error)
                    halfway.set()

            caller = threading.Thread(target=burst)
            caller.start()
            assert halfway.wait(120)
            redis.close()  # stopped mid-burst: groups and messages in flight are gone
            redis.enter_context(redis_server(port))
            caller.join(180)
            assert not caller.is_alive() and not failures, failures

            for ws in opened:
                seqs: list[int] = []
                while len(seqs) < 2 * CALLS:
                    message = json.loads(ws.recv(timeout=60))
                    seqs.append(message["seq"])
                assert seqs == list(range(1, 2 * CALLS + 1))
