"""The approvals HTTP surface: holding a call (202), the decision endpoint's answers
(200, 400, 403, 404, 409), the list of what an operator may decide, and cancelling."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.approvals.models import ApprovalRequest, ApprovalStatus, Vote
from apps.invocations.models import RunEvent
from apps.policies.models import Outcome, Policy
from tests.approvals.support import (
    CONFIRM,
    ECHO,
    add_rule,
    cancel_url,
    drain_queue,
    event_types,
    hold,
    logged_in,
    make_operator,
    post_decision,
    queue_entries,
    record_of,
    require_approval,
)

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------- holding


def test_an_external_side_effect_call_under_an_approval_policy_is_held_with_202(caller):
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    policy.approval_effects = ["external_side_effect"]
    policy.save()

    response = caller.invoke(CONFIRM, toolCallId="call-held", runId="run-held")

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "pending_approval"
    assert body["toolId"] == CONFIRM
    assert body["toolCallId"] == "call-held"
    assert body["runId"] == "run-held"
    approval = ApprovalRequest.objects.get(pk=body["approvalId"])
    assert body["invocationId"] == str(approval.invocation_id)
    assert "ok" not in body and "result" not in body
    assert approval.status == ApprovalStatus.PENDING
    assert approval.policy_rule == policy.label
    assert "requires approval for external_side_effect" in approval.hold_reason


def test_a_held_call_reads_back_as_pending_approval(caller):
    body, approval = hold(caller, CONFIRM)

    response = caller.client.get(f"/api/v1/invocations/{body['invocationId']}/")

    assert response.status_code == 200, response.content
    record = response.json()
    assert record["status"] == "pending_approval"
    assert record["approvalId"] == str(approval.pk)
    assert "ok" not in record and "result" not in record


def test_a_held_call_emits_approval_required_with_its_args_effect_and_consequence(caller):
    require_approval(caller.tenant, ECHO)
    body, approval = hold(caller, ECHO, args={"text": "hello"}, runId="run-event")

    required = RunEvent.objects.get(run_id="run-event", type="approval_required").message
    assert required["approvalId"] == str(approval.pk)
    assert required["args"] == {"text": "hello"}
    assert required["effect"] == "read_only"
    assert required["consequenceLevel"] == "low"
    assert required["toolCallId"] == body["toolCallId"]
    assert event_types(caller.tenant, "run-event") == ["approval_required"]


def test_a_cel_require_approval_rule_holds_the_calls_it_matches(caller):
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    rule = add_rule(policy, 'args.text.startsWith("pay")', Outcome.REQUIRE_APPROVAL, ECHO)

    free = caller.invoke(ECHO, args={"text": "hello"})
    assert free.status_code == 200, free.content
    assert free.json()["ok"] is True

    _, approval = hold(caller, ECHO, args={"text": "pay 500"})
    assert approval.policy_rule == rule.label
    assert record_of(approval).status == "pending_approval"


def test_an_idempotent_retry_of_a_held_call_returns_the_same_approval(caller):
    first, _approval = hold(caller, CONFIRM, idempotencyKey="key-1")

    retry = caller.invoke(CONFIRM, idempotencyKey="key-1")

    assert retry.status_code == 202, retry.content
    assert retry.json()["approvalId"] == first["approvalId"]
    assert retry.json()["invocationId"] == first["invocationId"]
    assert ApprovalRequest.objects.count() == 1


# ---------------------------------------------------------------- the decision endpoint


def test_approving_answers_200_with_the_approval(caller, operator):
    _, approval = hold(caller, CONFIRM)

    response = post_decision(logged_in(operator), approval.pk, "approve", reason="fine")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["approvalId"] == str(approval.pk)
    assert body["status"] == "approved"
    assert body["decidedBy"] == "oscar"
    assert body["reason"] == "fine"
    assert body["approvalsGiven"] == 1


def test_an_unknown_approval_is_404(caller, operator):
    response = post_decision(logged_in(operator), uuid.uuid4())
    assert response.status_code == 404, response.content


def test_another_tenants_operator_gets_404_and_the_request_stays_pending(caller, other):
    _, approval = hold(caller, CONFIRM)
    outsider = make_operator("gina", other.tenant)  # decide_approval on the tool, wrong tenant

    response = post_decision(logged_in(outsider), approval.pk)

    assert response.status_code == 404, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_an_operator_without_decide_approval_on_the_tool_gets_403(caller):
    _, approval = hold(caller, CONFIRM)
    echo_only = make_operator("eddie", caller.tenant, tools=(ECHO,))

    response = post_decision(logged_in(echo_only), approval.pk)

    assert response.status_code == 403, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert not Vote.objects.exists()


def test_a_non_staff_user_gets_403_even_with_decide_approval(caller):
    _, approval = hold(caller, CONFIRM)
    member = make_operator("nina", caller.tenant, is_staff=False)

    response = post_decision(logged_in(member), approval.pk)

    assert response.status_code == 403, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_an_api_key_caller_cannot_decide(caller):
    _, approval = hold(caller, CONFIRM)

    response = post_decision(caller.client, approval.pk)

    assert response.status_code == 403, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_approving_twice_is_409(caller, operator):
    _, approval = hold(caller, CONFIRM)
    client = logged_in(operator)
    assert post_decision(client, approval.pk).status_code == 200

    again = post_decision(client, approval.pk)

    assert again.status_code == 409, again.content
    assert len(queue_entries(approval)) == 1


def test_rejecting_after_an_approval_is_409(caller, operator):
    _, approval = hold(caller, CONFIRM)
    assert post_decision(logged_in(operator), approval.pk).status_code == 200
    second = make_operator("sam", caller.tenant)

    response = post_decision(logged_in(second), approval.pk, "reject", reason="too late")

    assert response.status_code == 409, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert record_of(approval).status == "queued"


def test_an_expired_request_is_409_and_the_call_ends_approval_expired_unrun(caller, operator):
    _, approval = hold(caller, CONFIRM, runId="run-late")
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    response = post_decision(logged_in(operator), approval.pk)

    assert response.status_code == 409, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    record = record_of(approval)
    assert record.status == "failed"
    assert record.error_code == "approval_expired"
    assert record.result is None
    drain_queue()
    assert queue_entries(approval) == []
    assert record_of(approval).error_code == "approval_expired"


def test_a_cancelled_request_is_409(caller, operator):
    body, approval = hold(caller, CONFIRM)
    assert caller.client.post(cancel_url(body["invocationId"])).status_code == 200

    response = post_decision(logged_in(operator), approval.pk)

    assert response.status_code == 409, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CANCELLED


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "maybe"},
        {"decision": "approve", "extra": True},
        {"decision": "approve", "args": ["not", "an", "object"]},
        {"reason": "no decision at all"},
        {"decision": "reject", "reason": "x" * 1001},
    ],
    ids=["unknown-decision", "extra-key", "args-not-object", "missing-decision", "long-reason"],
)
def test_a_malformed_decision_body_is_400_and_changes_nothing(caller, operator, body):
    _, approval = hold(caller, CONFIRM)

    response = logged_in(operator).post(
        f"/api/v1/approvals/{approval.pk}/decision/", body, format="json"
    )

    assert response.status_code == 400, response.content
    assert response.json()["errors"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert not Vote.objects.exists()


def test_a_decision_body_that_is_not_an_object_is_400(caller, operator):
    _, approval = hold(caller, CONFIRM)
    response = logged_in(operator).post(
        f"/api/v1/approvals/{approval.pk}/decision/", ["approve"], format="json"
    )
    assert response.status_code == 400, response.content


def test_an_anonymous_decision_is_401(caller):
    _, approval = hold(caller, CONFIRM)

    response = post_decision(APIClient(), approval.pk)

    assert response.status_code == 401, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


# ---------------------------------------------------------------- listing


def test_the_pending_list_holds_only_what_the_caller_may_decide(caller, other):
    confirm_only = make_operator("connie", caller.tenant, tools=(CONFIRM,))
    require_approval(caller.tenant, ECHO)
    _, mine = hold(caller, CONFIRM)
    _, decided = hold(caller, CONFIRM)
    _, echo = hold(caller, ECHO, args={"text": "not your tool"})
    _, foreign = hold(other, CONFIRM)
    assert post_decision(logged_in(confirm_only), decided.pk).status_code == 200
    client = logged_in(confirm_only)

    pending = client.get("/api/v1/approvals/", {"status": "pending"})
    everything = client.get("/api/v1/approvals/")

    assert pending.status_code == 200, pending.content
    assert [a["approvalId"] for a in pending.json()["results"]] == [str(mine.pk)]
    listed = {a["approvalId"] for a in everything.json()["results"]}
    assert listed == {str(mine.pk), str(decided.pk)}
    assert str(echo.pk) not in listed and str(foreign.pk) not in listed


def test_the_pending_list_is_empty_for_an_api_key(caller):
    hold(caller, CONFIRM)
    response = caller.client.get("/api/v1/approvals/", {"status": "pending"})
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


def test_an_unknown_status_filter_is_400(caller, operator):
    response = logged_in(operator).get("/api/v1/approvals/", {"status": "maybe"})
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["field"] == "status"


def test_an_approval_reads_back_for_its_decider_and_404_for_others(caller, other):
    _, approval = hold(caller, CONFIRM)
    operator = make_operator("oscar", caller.tenant)
    outsider = make_operator("gina", other.tenant)

    mine = logged_in(operator).get(f"/api/v1/approvals/{approval.pk}/")
    theirs = logged_in(outsider).get(f"/api/v1/approvals/{approval.pk}/")

    assert mine.status_code == 200, mine.content
    assert mine.json()["status"] == "pending"
    assert mine.json()["args"] == {}
    assert theirs.status_code == 404, theirs.content


# ---------------------------------------------------------------- cancelling


def test_cancelling_a_pending_call_ends_it_cancelled_and_a_later_approval_is_409(caller, operator):
    body, approval = hold(caller, CONFIRM, runId="run-cancel")

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert response.json()["errorCode"] == "cancelled"
    record = record_of(approval)
    assert (record.status, record.error_code, record.ok) == ("cancelled", "cancelled", False)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CANCELLED
    assert post_decision(logged_in(operator), approval.pk).status_code == 409
    decided = list(RunEvent.objects.filter(run_id="run-cancel", type="approval_decided"))
    assert [e.message["decision"] for e in decided] == ["cancel"]


def test_cancelling_an_approved_queued_call_keeps_the_queue_from_running_it(
    caller, operator, tally
):
    body, approval = hold(caller, "test__tally", args=tally.args("queued"))
    assert post_decision(logged_in(operator), approval.pk).status_code == 200
    assert record_of(approval).status == "queued"

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    drain_queue()
    assert tally.count("queued") == 0
    record = record_of(approval)
    assert (record.status, record.error_code) == ("cancelled", "cancelled")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CANCELLED
    assert [entry.return_value for entry in queue_entries(approval)] == ["cancelled"]


def test_cancelling_a_finished_call_is_409(caller, operator):
    body, approval = hold(caller, CONFIRM)
    assert post_decision(logged_in(operator), approval.pk).status_code == 200
    drain_queue()
    assert record_of(approval).status == "succeeded"

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 409, response.content
    assert record_of(approval).status == "succeeded"


def test_cancelling_a_rejected_call_is_409(caller, operator):
    body, approval = hold(caller, CONFIRM)
    assert post_decision(logged_in(operator), approval.pk, "reject", reason="no").status_code == 200

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 409, response.content
    assert record_of(approval).error_code == "approval_rejected"


def test_another_tenant_cannot_cancel_a_held_call(caller, other):
    body, approval = hold(caller, CONFIRM)

    response = other.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 404, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
