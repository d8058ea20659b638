"""The operator console (queue, detail, decisions, history) and the admin's bulk actions,
driven with Django's test client as a logged-in staff operator."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from django.utils.html import escape

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.tenants.roles import Role, grant_role
from apps.tools.models import Tool
from tests.approvals.support import (
    CONFIRM,
    ECHO,
    hold,
    make_operator,
    record_of,
    require_approval,
)
from tests.support.deep_json import TOO_DEEP, deep_texts, logged_tracebacks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def console(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


def detail_url(approval: ApprovalRequest) -> str:
    return f"/console/approvals/{approval.pk}/"


def status_of(approval: ApprovalRequest) -> str:
    return ApprovalRequest.objects.get(pk=approval.pk).status


# ---------------------------------------------------------------- the queue


def test_the_queue_lists_pending_calls_of_the_operators_tenants_only(caller, other, console):
    _, mine = hold(caller, CONFIRM)
    _, theirs = hold(other, CONFIRM)

    response = console.get("/console/")

    assert response.status_code == 200
    page = response.content.decode()
    assert f'data-approval-id="{mine.pk}"' in page
    assert str(theirs.pk) not in page
    assert "agent:test" in page


def test_the_queue_leaves_out_decided_calls(caller, operator, console):
    _, decided = hold(caller, CONFIRM)
    decisions.decide(decided.pk, operator, "approve")

    response = console.get("/console/")

    assert str(decided.pk) not in response.content.decode()
    assert "Nothing is waiting for you." in response.content.decode()


def test_the_rows_fragment_holds_only_the_rows(caller, console):
    _, approval = hold(caller, CONFIRM)

    response = console.get("/console/queue/rows/")

    assert response.status_code == 200
    fragment = response.content.decode()
    assert f'data-approval-id="{approval.pk}"' in fragment
    assert fragment.lstrip().startswith("<tr")
    assert "<html" not in fragment and "<table" not in fragment


# ---------------------------------------------------------------- the detail page


def test_the_detail_page_shows_what_will_run_and_why_it_waits(caller, console):
    policy = require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello <b>"}, runId="run-detail")

    response = console.get(detail_url(approval))

    assert response.status_code == 200
    page = response.content.decode()
    assert ECHO in page
    assert "read only" in page  # effect
    assert "<dt>Consequence</dt><dd>low</dd>" in page
    assert "agent:test" in page and "(tenant acme)" in page
    assert "run-detail" in page
    pretty = json.dumps(approval.args, indent=2, ensure_ascii=False)
    assert escape(pretty) in page  # pretty-printed, escaped: no markup injection
    assert "<b>" not in page.split('id="args"')[1].split("</pre>")[0]
    assert escape(approval.hold_reason) in page
    assert policy.label in page
    assert "Time left" in page
    assert f'data-expires="{approval.expires_at.isoformat()}"' in page
    assert 'name="csrfmiddlewaretoken"' in page


def test_approving_in_the_console_redirects_to_the_queue_and_approves(caller, console):
    _, approval = hold(caller, CONFIRM)

    response = console.post(detail_url(approval), {"action": "approve"})

    assert response.status_code == 302
    assert response["Location"] == "/console/"
    assert status_of(approval) == ApprovalStatus.APPROVED
    assert record_of(approval).status == "queued"


def test_rejecting_without_a_reason_is_a_form_error_and_stays_pending(caller, console):
    _, approval = hold(caller, CONFIRM)

    response = console.post(detail_url(approval), {"action": "reject", "reason": "  "})

    assert response.status_code == 200
    assert "Say why you reject it" in response.content.decode()
    assert status_of(approval) == ApprovalStatus.PENDING


def test_rejecting_with_a_reason_rejects(caller, console):
    _, approval = hold(caller, CONFIRM)

    response = console.post(detail_url(approval), {"action": "reject", "reason": "Too risky."})

    assert response.status_code == 302
    assert status_of(approval) == ApprovalStatus.REJECTED
    record = record_of(approval)
    assert (record.error_code, record.safe_message) == ("approval_rejected", "Too risky.")


def test_editing_with_invalid_json_shows_the_error_and_stays_pending(caller, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})

    response = console.post(detail_url(approval), {"action": "edit", "args": '{"text": '})

    assert response.status_code == 200
    assert "not valid JSON" in response.content.decode()
    assert status_of(approval) == ApprovalStatus.PENDING


@deep_texts
def test_editing_with_json_nested_too_deeply_shows_the_error_and_stays_pending(
    caller, console, text, caplog
):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})

    response = console.post(detail_url(approval), {"action": "edit", "args": text})

    assert response.status_code == 200
    assert f"The edited arguments are refused. {TOO_DEEP}" in response.content.decode()
    assert status_of(approval) == ApprovalStatus.PENDING
    assert logged_tracebacks(caplog) == []


def test_editing_with_args_the_schema_refuses_shows_why_and_stays_pending(caller, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})

    response = console.post(
        detail_url(approval), {"action": "edit", "args": '{"text": 1}'}, follow=True
    )

    assert "Invalid arguments" in response.content.decode()
    assert status_of(approval) == ApprovalStatus.PENDING


def test_editing_with_valid_args_approves_them(caller, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})

    response = console.post(detail_url(approval), {"action": "edit", "args": '{"text": "bye"}'})

    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.args == {"text": "bye", "secret_note": ""}


def test_a_post_without_a_csrf_token_is_403_and_stays_pending(caller, operator):
    _, approval = hold(caller, CONFIRM)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    response = client.post(detail_url(approval), {"action": "approve"})

    assert response.status_code == 403
    assert status_of(approval) == ApprovalStatus.PENDING


def test_a_decided_call_shows_no_form(caller, operator, console):
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "reject", reason="Nope.")

    page = console.get(detail_url(approval)).content.decode()

    assert 'id="decision-form"' not in page
    assert "Nope." in page


def test_posting_a_decision_on_a_decided_call_reports_it(caller, operator, console):
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "reject", reason="Nope.")

    response = console.post(detail_url(approval), {"action": "approve"}, follow=True)

    assert "already rejected" in response.content.decode()
    assert status_of(approval) == ApprovalStatus.REJECTED


# ---------------------------------------------------------------- history


def test_the_history_searches_decided_approvals(caller, operator, console):
    _, banana = hold(caller, CONFIRM)
    _, apple = hold(caller, CONFIRM)
    _, waiting = hold(caller, CONFIRM)
    decisions.decide(banana.pk, operator, "reject", reason="smells of banana")
    decisions.decide(apple.pk, operator, "approve", reason="fine apple")

    found = console.get("/console/history/", {"q": "banana"}).content.decode()
    everything = console.get("/console/history/").content.decode()
    nothing = console.get("/console/history/", {"q": "cherry"}).content.decode()

    assert str(banana.pk) in found and str(apple.pk) not in found
    assert str(banana.pk) in everything and str(apple.pk) in everything
    assert str(waiting.pk) not in everything  # pending calls are not history
    assert "No decisions match." in nothing
    by_operator = console.get("/console/history/", {"q": "oscar"}).content.decode()
    assert str(banana.pk) in by_operator and str(apple.pk) in by_operator


# ---------------------------------------------------------------- who may see it


@pytest.mark.parametrize("path", ["/console/", "/console/queue/rows/", "/console/history/"])
def test_anonymous_users_are_sent_to_the_login_page(caller, path):
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_anonymous_users_cannot_decide(caller):
    _, approval = hold(caller, CONFIRM)

    response = Client().post(detail_url(approval), {"action": "approve"})

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert status_of(approval) == ApprovalStatus.PENDING


def test_an_operator_without_decide_approval_gets_404_on_the_detail(caller):
    _, approval = hold(caller, CONFIRM)
    echo_only = make_operator("eddie", caller.tenant, tools=(ECHO,))
    client = Client()
    client.force_login(echo_only)

    assert client.get(detail_url(approval)).status_code == 404
    assert client.post(detail_url(approval), {"action": "approve"}).status_code == 404
    assert str(approval.pk) not in client.get("/console/").content.decode()
    assert status_of(approval) == ApprovalStatus.PENDING


def test_another_tenants_operator_gets_404_on_the_detail(caller, other):
    _, approval = hold(caller, CONFIRM)
    client = Client()
    client.force_login(make_operator("gina", other.tenant))

    assert client.get(detail_url(approval)).status_code == 404


# ---------------------------------------------------------------- admin bulk actions


@pytest.fixture
def admin_operator(operator):
    """The operator, with the operator role of their tenant (which shows approval
    requests in the admin)."""
    for tenant in operator.tenants.all():
        grant_role(operator, tenant, Role.OPERATOR)
    client = Client()
    client.force_login(operator)
    return client


def admin_action(client: Client, action: str, *approvals: ApprovalRequest):
    return client.post(
        "/admin/approvals/approvalrequest/",
        {"action": action, "_selected_action": [str(a.pk) for a in approvals]},
        follow=True,
    )


def test_the_admin_approves_several_pending_requests_at_once(caller, admin_operator):
    _, one = hold(caller, CONFIRM)
    _, two = hold(caller, CONFIRM)

    response = admin_action(admin_operator, "approve_selected", one, two)

    assert response.status_code == 200
    assert status_of(one) == status_of(two) == ApprovalStatus.APPROVED
    assert record_of(one).status == record_of(two).status == "queued"
    assert "2 request(s) approved" in response.content.decode()


def test_an_admin_bulk_action_reports_a_decided_request_and_leaves_it_alone(
    caller, operator, admin_operator
):
    _, pending = hold(caller, CONFIRM)
    _, rejected = hold(caller, CONFIRM)
    decisions.decide(rejected.pk, operator, "reject", reason="earlier")

    response = admin_action(admin_operator, "approve_selected", pending, rejected)

    page = response.content.decode()
    assert status_of(pending) == ApprovalStatus.APPROVED
    assert status_of(rejected) == ApprovalStatus.REJECTED
    # The admin capitalizes a message's first letter, which may be the id's.
    assert f"{rejected.pk}: this request is already rejected." in page.lower()
    assert "1 request(s) approved" in page
    assert ApprovalRequest.objects.get(pk=rejected.pk).decision_reason == "earlier"


def test_the_admin_rejects_selected_requests_through_decisions(caller, admin_operator):
    _, one = hold(caller, CONFIRM)

    admin_action(admin_operator, "reject_selected", one)

    assert status_of(one) == ApprovalStatus.REJECTED
    record = record_of(one)
    assert (record.error_code, record.safe_message) == (
        "approval_rejected",
        "Decided in the admin.",
    )


# ---------------------------------------------------------------- bulk decisions


def bulk(client: Client, action: str, *approvals: ApprovalRequest | str, reason: str = "") -> str:
    ids = [str(getattr(each, "pk", each)) for each in approvals]
    response = client.post(
        "/console/queue/decide/", {"action": action, "ids": ids, "reason": reason}
    )
    assert response.status_code == 302 and response["Location"] == "/console/"
    return client.get("/console/").content.decode()


def test_the_queue_approves_the_ticked_calls_each_on_its_own(caller, operator, console):
    _, first = hold(caller, CONFIRM)
    _, second = hold(caller, CONFIRM)
    _, untouched = hold(caller, CONFIRM)
    _, decided = hold(caller, CONFIRM)
    decisions.decide(decided.pk, operator, "reject", reason="no")
    page = console.get("/console/").content.decode()
    assert 'name="ids"' in page and 'id="bulk-approve"' in page

    page = bulk(console, "approve", first, second, decided, reason="routine")

    assert status_of(first) == status_of(second) == ApprovalStatus.APPROVED
    assert status_of(untouched) == ApprovalStatus.PENDING
    assert status_of(decided) == ApprovalStatus.REJECTED  # the first decision stands
    assert "2 of 3 decided" in page
    assert escape("This request is already rejected.") in page
    assert ApprovalRequest.objects.get(pk=first.pk).decision_reason == "routine"


def test_high_consequence_calls_are_not_approved_in_bulk(caller, console):
    Tool.objects.filter(pk=CONFIRM).update(consequence_level="high")
    _, risky = hold(caller, CONFIRM)
    page = bulk(console, "approve", risky)
    assert status_of(risky) == ApprovalStatus.PENDING
    assert "high consequence: review it on its page" in page
    page = bulk(console, "reject", risky, reason="not today")  # rejecting is fine
    assert status_of(risky) == ApprovalStatus.REJECTED


def test_bulk_reject_needs_a_reason_and_sends_it_back(caller, console):
    _, first = hold(caller, CONFIRM)
    _, second = hold(caller, CONFIRM)
    page = bulk(console, "reject", first, second)
    assert "Say why you reject them" in page
    assert status_of(first) == status_of(second) == ApprovalStatus.PENDING
    bulk(console, "reject", first, second, reason="out of budget")
    assert status_of(first) == status_of(second) == ApprovalStatus.REJECTED
    assert "out of budget" in record_of(first).safe_message


@pytest.mark.parametrize(
    "ids, message",
    [
        ([], "Tick the calls to decide first."),
        (["not-a-uuid"], "A ticked call is not one of the queue"),
        ([str(uuid.uuid4()) for _ in range(decisions.BULK_LIMIT + 1)], "at most 100 calls"),
    ],
)
def test_bad_bulk_posts_decide_nothing_and_say_why(caller, console, ids, message):
    _, waiting = hold(caller, CONFIRM)
    response = console.post("/console/queue/decide/", {"action": "approve", "ids": ids})
    assert response.status_code == 302
    assert escape(message) in console.get("/console/").content.decode()
    assert status_of(waiting) == ApprovalStatus.PENDING


def test_bulk_cannot_reach_another_tenants_calls(caller, other, console):
    _, theirs = hold(other, CONFIRM)
    page = bulk(console, "approve", theirs)
    assert status_of(theirs) == ApprovalStatus.PENDING
    assert "No such approval request in your tenants." in page


def test_the_history_marks_edited_approvals(caller, operator, console):
    require_approval(caller.tenant, ECHO)
    _, edited = hold(caller, ECHO, args={"text": "pay 500"})
    _, plain = hold(caller, ECHO, args={"text": "pay 7"})
    decisions.decide(edited.pk, operator, "approve", "lowered", {"text": "pay 50"})
    decisions.decide(plain.pk, operator, "approve", "fine")
    rows = {
        row.split('href="/console/approvals/')[1][:36]: row
        for row in console.get("/console/history/").content.decode().split("<tr>")[2:]
    }
    assert 'class="badge edited"' in rows[str(edited.pk)]
    assert 'class="badge edited"' not in rows[str(plain.pk)]
