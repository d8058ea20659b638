"""The operators' stream asks the role in the tenant of each event (issue 42), against a
real Daphne process: one stream listens to every tenant the user has a role in, and
sends an approval only where that role (or an object permission) lets them decide it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.tenants.models import Role
from apps.tenants.roles import grant_role
from tests.streams.conftest import KeyClient, events, logged_in, nothing_arrives, open_ws

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]

STREAM = "/ws/v1/approvals/"


def hold(server, agent, run_id: str) -> dict:
    body = KeyClient(server, agent.key).invoke(
        "test__confirm", args={}, runId=run_id, toolCallId=f"{run_id}-confirm"
    )
    assert body["status"] == "pending_approval", body
    return body


def staff(username: str) -> User:
    return User.objects.create_user(username, password=f"pw-{username}-123", is_staff=True)


def test_a_member_of_one_tenant_and_operator_of_another_sees_only_the_other(server, acme, globex):
    dana = staff("dana")
    grant_role(dana, acme.tenant, Role.MEMBER)  # no decide_approval in acme
    grant_role(dana, globex.tenant, Role.OPERATOR)
    with open_ws(server, STREAM, logged_in(server, dana).ws_headers) as ws:
        hold(server, acme, "run-acme")
        held = hold(server, globex, "run-globex")
        [required] = events(ws, 1)
        nothing_arrives(ws)
    assert required["approvalId"] == held["approvalId"]
    assert required["runId"] == "run-globex"


def test_a_staff_user_in_no_tenant_receives_nothing(server, acme, globex):
    loner = staff("loner")
    with open_ws(server, STREAM, logged_in(server, loner).ws_headers) as ws:
        hold(server, acme, "run-acme")
        hold(server, globex, "run-globex")
        nothing_arrives(ws)
