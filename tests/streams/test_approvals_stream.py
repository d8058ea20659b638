"""The operators' stream /ws/v1/approvals/ against a real Daphne process.

Held calls are made and decided through Daphne's HTTP API (an agent's key, an
operator's session with its CSRF token), so the events reach Daphne's channel layer.
"""

from __future__ import annotations

import pytest

from tests.streams.conftest import (
    QUIET,
    KeyClient,
    events,
    logged_in,
    nothing_arrives,
    open_ws,
    operator,
    refusal,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

STREAM = "/ws/v1/approvals/"


def hold(server, agent, run_id: str = "run-held") -> dict:
    body = KeyClient(server, agent.key).invoke(
        "test__confirm", args={}, runId=run_id, toolCallId=f"{run_id}-confirm"
    )
    assert body["status"] == "pending_approval", body
    return body


def test_an_operator_sees_a_held_call_appear_and_be_decided(server, acme):
    olga = operator("olga", acme.tenant, decide=("test__confirm",))
    browser = logged_in(server, olga)
    with open_ws(server, STREAM, browser.ws_headers) as ws:
        nothing_arrives(ws, 0.3)
        held = hold(server, acme)
        [required] = events(ws, 1)
        decided_body = browser.decide(held["approvalId"], "approve", "looks fine")
        [decided] = events(ws, 1)
        nothing_arrives(ws)  # no run events (tool_call_*) on the operators' stream

    assert required["type"] == "approval_required"
    assert required["approvalId"] == held["approvalId"]
    assert required["runId"] == "run-held"
    assert required["toolCallId"] == "run-held-confirm"
    assert required["toolId"] == "test__confirm"
    assert required["args"] == {}
    assert required["effect"] == "external_side_effect"
    assert required["consequenceLevel"]
    assert required["v"] == 1 and required["seq"] == 1

    assert decided_body["status"] == "approved"
    assert decided["type"] == "approval_decided"
    assert decided["approvalId"] == held["approvalId"]
    assert decided["decision"] == "approve"
    assert decided["decidedBy"] == "olga"
    assert decided["reason"] == "looks fine"
    assert decided["seq"] == 2


def test_a_rejection_reaches_the_operator_and_the_run_stream(server, acme):
    olga = operator("olga", acme.tenant, decide=("test__confirm",))
    browser = logged_in(server, olga)
    with (
        open_ws(server, STREAM, browser.ws_headers) as operators,
        open_ws(server, "/ws/v1/runs/run-held/", {"Authorization": f"Bearer {acme.key}"}) as run,
    ):
        held = hold(server, acme)
        browser.decide(held["approvalId"], "reject", "not today")
        decided = events(operators, 2)[1]
        on_run = events(run, 4)
    assert decided["decision"] == "reject" and decided["reason"] == "not today"
    assert [e["type"] for e in on_run] == [
        "approval_required",
        "approval_decided",
        "tool_call_start",
        "tool_call_result",
    ]
    assert on_run[3]["ok"] is False and on_run[3]["errorCode"] == "approval_rejected"


def test_an_operator_of_another_tenant_receives_nothing(server, acme, globex):
    outsider = operator("gus", globex.tenant, decide=("test__confirm",))
    insider = operator("olga", acme.tenant, decide=("test__confirm",))
    with (
        open_ws(server, STREAM, logged_in(server, outsider).ws_headers) as theirs,
        open_ws(server, STREAM, logged_in(server, insider).ws_headers) as ours,
    ):
        held = hold(server, acme)
        assert events(ours, 1)[0]["approvalId"] == held["approvalId"]
        nothing_arrives(theirs)
        # ... and they do see their own tenant's.
        own = hold(server, globex)
        assert events(theirs, 1)[0]["approvalId"] == own["approvalId"]
        nothing_arrives(ours)


def test_an_operator_without_decide_approval_receives_nothing(server, acme):
    watcher = operator("walt", acme.tenant, decide=("test__echo",))  # not test__confirm
    with open_ws(server, STREAM, logged_in(server, watcher).ws_headers) as ws:
        hold(server, acme)
        nothing_arrives(ws, 2 * QUIET)


def test_anonymous_and_agents_are_refused(server, acme):
    assert refusal(server, STREAM) == 4403
    assert refusal(server, STREAM, {"Origin": server}) == 4403
    assert refusal(server, STREAM, {"Authorization": f"Bearer {acme.key}"}) == 4403


def test_a_foreign_page_cannot_use_an_operators_session(server, acme):
    olga = operator("olga", acme.tenant, decide=("test__confirm",))
    headers = {**logged_in(server, olga).ws_headers, "Origin": "http://evil.example"}
    assert refusal(server, STREAM, headers) == "HTTP 403"
