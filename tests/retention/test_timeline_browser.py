"""A run's console timeline in a real browser, after retention pruned its events: the
page resumes after the pruned ones (events_pruned, 4410) and shows new events live."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import (  # noqa: F401
    _async_unsafe_allowed,
    _static_collected,
    browser,
    make_operator,
    new_context,
)
from tests.browser.test_operator_console import SERVER_ENV, log_in
from tests.conftest import CORE_TOOLS, allow, make_agent
from tests.retention.support import CLOCK, age, keep_for, prune
from tests.support.http import api
from tests.support.server import daphne

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_leg("postgresql"),
]


def test_the_timeline_of_a_pruned_run_resumes_after_the_pruned_events(
    new_context,  # noqa: F811
    make_operator,  # noqa: F811
):
    agent = make_agent("acme")
    allow(agent.tenant, *CORE_TOOLS)
    operator = make_operator(agent.tenant, "tess")
    with daphne(SERVER_ENV) as base:
        made = [
            api(
                base, agent.key, "POST", "/api/v1/invocations/", {"toolId": CLOCK, "runId": "run-t"}
            )
            for _ in range(2)
        ]
        assert [status for status, _ in made] == [200, 200]
        keep_for(agent.tenant, 30)
        age([body["invocationId"] for _, body in made], 31)
        prune()
        page = new_context(base).new_page()
        log_in(page, operator.username, "/console/runs/run-t/?tenant=acme")
        expect(page.locator("#no-events")).to_be_visible()

        status, _ = api(
            base, agent.key, "POST", "/api/v1/invocations/", {"toolId": CLOCK, "runId": "run-t"}
        )
        assert status == 200

        expect(page.locator("li.event[data-seq='5']")).to_be_visible()
        expect(page.locator("li.event[data-seq='6']")).to_be_visible()
        expect(page.locator("#live-state")).to_have_text("live")
