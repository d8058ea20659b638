"""What a decision does to the held call: approve runs it (through the queue), reject
ends it with the reason, edits are validated, re-checked and re-bound, four-eyes and
quorums hold, and a running approved call can be cancelled."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User
from guardian.shortcuts import assign_perm

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, ApprovalStatus, Vote
from apps.invocations import runner
from apps.invocations.models import InvocationRecord
from apps.policies.models import Outcome, Policy
from apps.tools.models import Tool
from tests.approvals.support import (
    CONFIRM,
    ECHO,
    SLEEP,
    add_rule,
    cancel_url,
    drain_queue,
    event_types,
    events,
    hold,
    logged_in,
    make_operator,
    post_decision,
    queue_entries,
    record_of,
    require_approval,
)
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def held_echo(caller):
    """test__echo needs approval for `acme`'s agent."""
    return require_approval(caller.tenant, ECHO, SLEEP)


# ---------------------------------------------------------------- approve


def test_an_approved_call_is_queued_then_runs_and_the_caller_sees_the_normal_record(
    caller, operator
):
    body, approval = hold(caller, CONFIRM, runId="run-ok")
    assert post_decision(logged_in(operator), approval.pk).status_code == 200
    assert caller.client.get(f"/api/v1/invocations/{body['invocationId']}/").json()["status"] == (
        "queued"
    )

    drain_queue()

    record = caller.client.get(f"/api/v1/invocations/{body['invocationId']}/").json()
    assert record["status"] == "succeeded"
    assert record["ok"] is True
    assert record["result"] == {"waited": 0}
    assert "errorCode" not in record
    assert record["approvalId"] == str(approval.pk)
    assert record["startedAt"] and record["endedAt"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.SUCCEEDED


def test_an_approved_calls_events_come_in_order(caller, operator):
    _, approval = hold(caller, CONFIRM, runId="run-order")
    post_decision(logged_in(operator), approval.pk)
    drain_queue()

    stream = events(caller.tenant, "run-order")

    assert [e["type"] for e in stream] == [
        "approval_required",
        "approval_decided",
        "tool_call_start",
        "tool_call_result",
    ]
    seqs = [e["seq"] for e in stream]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    decided = stream[1]
    assert decided["decision"] == "approve"
    assert decided["decidedBy"] == "oscar"
    assert decided["approvalId"] == str(approval.pk)
    assert stream[3]["ok"] is True and stream[3]["result"] == {"waited": 0}
    assert {e["toolCallId"] for e in stream} == {approval.tool_call_id}


# ---------------------------------------------------------------- reject


def test_a_rejection_ends_the_call_with_its_reason_as_the_safe_message(caller, operator):
    body, approval = hold(caller, CONFIRM, runId="run-no")

    response = post_decision(logged_in(operator), approval.pk, "reject", reason="Not today.")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "rejected"
    record = caller.client.get(f"/api/v1/invocations/{body['invocationId']}/").json()
    assert record["status"] == "failed"
    assert record["ok"] is False
    assert record["errorCode"] == "approval_rejected"
    assert record["safeMessage"] == "Not today."
    assert "result" not in record
    stream = events(caller.tenant, "run-no")
    assert [e["type"] for e in stream] == [
        "approval_required",
        "approval_decided",
        "tool_call_start",
        "tool_call_result",
    ]
    assert (stream[1]["decision"], stream[1]["reason"]) == ("reject", "Not today.")
    assert stream[3]["errorCode"] == "approval_rejected"
    assert stream[3]["safeMessage"] == "Not today."
    assert queue_entries(approval) == []


def test_a_rejected_call_never_runs_even_when_the_queue_drains(caller, operator, tally):
    _, approval = hold(caller, "test__tally", args=tally.args("rejected"))
    post_decision(logged_in(operator), approval.pk, "reject", reason="no")
    drain_queue()
    assert tally.count("rejected") == 0
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED


# ---------------------------------------------------------------- edit and approve


def test_approving_edited_args_runs_the_edited_call_and_records_the_diff(
    caller, operator, held_echo
):
    body, approval = hold(caller, ECHO, args={"text": "hello"}, runId="run-edit")

    response = post_decision(logged_in(operator), approval.pk, args={"text": "edited"})

    assert response.status_code == 200, response.content
    data = response.json()
    assert data["argsDiff"] == [
        {"field": "text", "before": "hello", "after": "edited", "change": "changed"}
    ]
    assert data["args"] == {"text": "edited", "secret_note": ""}
    assert data["originalArgs"] == {"text": "hello", "secret_note": ""}
    drain_queue()
    record = caller.client.get(f"/api/v1/invocations/{body['invocationId']}/").json()
    assert record["status"] == "succeeded"
    assert record["result"] == {"text": "edited"}
    assert record["args"] == {"text": "edited"}
    stream = events(caller.tenant, "run-edit")
    assert stream[1]["argsEdited"] is True
    assert stream[2]["type"] == "tool_call_start" and stream[2]["args"] == {"text": "edited"}


def test_approving_edited_args_re_binds_the_approval_to_their_hash(caller, operator, held_echo):
    _, approval = hold(caller, ECHO, args={"text": "hello"})
    original = approval.bound_hash

    post_decision(logged_in(operator), approval.pk, args={"text": "edited"})
    approval.refresh_from_db()

    edited = runner.request_hash(ECHO, {"text": "edited", "secret_note": ""}, "")
    assert approval.bound_hash == edited != original
    assert Vote.objects.get(approval=approval).bound_hash == edited
    drain_queue()
    record = record_of(approval)
    assert record.request_hash == edited
    assert record.args == {"text": "edited"}


def test_a_call_whose_args_differ_from_the_approved_hash_does_not_run(caller, operator, tally):
    _, approval = hold(caller, "test__tally", args=tally.args("tampered"))
    post_decision(logged_in(operator), approval.pk)
    # Someone changes the stored args behind the decision's back.
    ApprovalRequest.objects.filter(pk=approval.pk).update(args=tally.args("swapped"))

    drain_queue()

    assert tally.count("tampered") == tally.count("swapped") == 0
    record = record_of(approval)
    assert (record.status, record.error_code) == ("failed", "policy_denied")
    assert "differs from what was approved" in record.safe_message


@pytest.mark.parametrize(
    "edited",
    [{"text": 5}, {"text": "ok", "surprise": "key"}, {}],
    ids=["wrong-type", "unknown-key", "missing-field"],
)
def test_edited_args_that_fail_validation_are_400_and_nothing_runs(
    caller, operator, held_echo, edited
):
    _, approval = hold(caller, ECHO, args={"text": "hello"}, runId="run-bad-edit")

    response = post_decision(logged_in(operator), approval.pk, args=edited)

    assert response.status_code == 400, response.content
    assert "Invalid arguments" in response.json()["detail"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert approval.args == {"text": "hello", "secret_note": ""}
    assert approval.args_diff == []
    assert not Vote.objects.exists()
    drain_queue()
    assert queue_entries(approval) == []
    assert record_of(approval).status == "pending_approval"
    assert event_types(caller.tenant, "run-bad-edit") == ["approval_required"]


def test_edited_args_a_policy_rule_denies_are_400(caller, operator, held_echo):
    add_rule(held_echo, 'args.text == "forbidden"', Outcome.DENY, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})

    response = post_decision(logged_in(operator), approval.pk, args={"text": "forbidden"})

    assert response.status_code == 400, response.content
    assert "Policy refuses" in response.json()["detail"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert approval.args["text"] == "hello"
    assert queue_entries(approval) == []


def test_approving_the_same_args_is_not_an_edit(caller, operator, held_echo):
    _, approval = hold(caller, ECHO, args={"text": "hello"})
    original = approval.bound_hash

    post_decision(logged_in(operator), approval.pk, args={"text": "hello", "secret_note": ""})

    approval.refresh_from_db()
    assert approval.args_diff == []
    assert approval.bound_hash == original


# ---------------------------------------------------------------- four eyes


@pytest.fixture
def self_invoking_operator(caller):
    """A staff member of `acme` who may both execute and decide test__confirm."""
    user = make_operator("olivia", caller.tenant)
    assign_perm("tools.execute_tool", user, Tool.objects.get(pk=CONFIRM))
    return user


def test_four_eyes_stops_an_operator_approving_their_own_call_but_not_a_colleague(
    caller, self_invoking_operator
):
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    policy.four_eyes = True
    policy.save()
    client = logged_in(self_invoking_operator)
    invoked = client.post("/api/v1/invocations/", {"toolId": CONFIRM}, format="json")
    assert invoked.status_code == 202, invoked.content
    approval = ApprovalRequest.objects.get(pk=invoked.json()["approvalId"])
    assert approval.principal == "user:olivia"
    assert approval.four_eyes is True

    own = post_decision(client, approval.pk)
    own_reject = post_decision(client, approval.pk, "reject", reason="mine")

    assert own.status_code == 403, own.content
    assert own_reject.status_code == 403, own_reject.content
    assert "Four-eyes" in own.json()["detail"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    colleague = make_operator("carl", caller.tenant)
    assert post_decision(logged_in(colleague), approval.pk).status_code == 200
    drain_queue()
    assert record_of(approval).status == "succeeded"


def test_without_four_eyes_an_operator_may_approve_their_own_call(caller, self_invoking_operator):
    client = logged_in(self_invoking_operator)
    invoked = client.post("/api/v1/invocations/", {"toolId": CONFIRM}, format="json")
    assert invoked.status_code == 202, invoked.content
    assert post_decision(client, invoked.json()["approvalId"]).status_code == 200


# ---------------------------------------------------------------- quorum


@pytest.fixture
def high_consequence(caller):
    Tool.objects.filter(pk=CONFIRM).update(consequence_level="high")
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    policy.high_consequence_quorum = 2
    policy.save()


def test_a_high_consequence_call_needs_two_different_operators(caller, high_consequence):
    _, approval = hold(caller, CONFIRM)
    assert approval.approvals_required == 2
    first = logged_in(make_operator("ann", caller.tenant))
    second = logged_in(make_operator("bob", caller.tenant))

    one = post_decision(first, approval.pk)
    again = post_decision(first, approval.pk)

    assert one.status_code == 200, one.content
    assert one.json()["status"] == "pending"
    assert one.json()["approvalsGiven"] == 1
    assert again.status_code == 200, again.content
    assert again.json()["status"] == "pending"
    assert again.json()["approvalsGiven"] == 1
    assert queue_entries(approval) == []
    assert record_of(approval).status == "pending_approval"

    two = post_decision(second, approval.pk)

    assert two.status_code == 200, two.content
    assert two.json()["status"] == "approved"
    assert two.json()["approvalsGiven"] == 2
    drain_queue()
    assert record_of(approval).status == "succeeded"


def test_one_rejection_ends_a_quorum_request(caller, high_consequence):
    _, approval = hold(caller, CONFIRM)
    post_decision(logged_in(make_operator("ann", caller.tenant)), approval.pk)

    response = post_decision(
        logged_in(make_operator("bob", caller.tenant)), approval.pk, "reject", reason="no way"
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "rejected"
    assert record_of(approval).error_code == "approval_rejected"


# ---------------------------------------------------------------- expiry through decide


def test_deciding_an_overdue_request_expires_it_instead(caller, operator):
    _, approval = hold(caller, CONFIRM, runId="run-overdue")
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=approval.created_at)

    with pytest.raises(decisions.AlreadyDecided):
        decisions.decide(approval.pk, operator, "approve")

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    assert record_of(approval).error_code == "approval_expired"
    decided = events(caller.tenant, "run-overdue")[1]
    assert (decided["type"], decided["decision"]) == ("approval_decided", "expire")


def test_a_decision_in_time_is_one_transaction_and_answers_from_what_it_wrote(caller, operator):
    """The usual decision: the approval is locked and read once (no read of whether it is
    overdue first), its votes are not counted (one approval required: this vote decides),
    nothing is read again for the answer, and on PostgreSQL the vote, the request, its
    receipt, the record's status and the approval_decided event are one statement. What
    it wrote is what the answer, the receipt and the stream say."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from toolhub_client import verify_receipt

    from apps.receipts.keys import instant
    from apps.receipts.models import DecisionReceipt
    from tests.receipts.support import published_keys

    _, approval = hold(caller, CONFIRM, runId="run-in-time")
    client = logged_in(operator)
    with CaptureQueriesContext(connection) as queries:
        response = post_decision(client, approval.pk)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["approvalsGiven"], body["decidedBy"]) == (
        "approved",
        1,
        operator.get_username(),
    )
    statements = [q["sql"] for q in queries.captured_queries]
    commit = next(n for n, sql in enumerate(statements) if sql.startswith("COMMIT"))
    assert sum(sql.startswith(("BEGIN", "SAVEPOINT")) for sql in statements) == 1, statements
    read = [sql for sql in statements if sql.startswith("SELECT") and "approvalrequest" in sql]
    assert len(read) == 1, read  # the locked read, and nothing else
    assert "FOR UPDATE" in read[0] or connection.vendor == "sqlite"  # BEGIN IMMEDIATE there
    assert not any("COUNT(" in sql for sql in statements), statements
    assert not any("approvals_" in sql for sql in statements[commit + 1 :]), statements
    writes = ("approvals_vote", "approvals_approvalrequest", "receipts_decisionreceipt")
    writes += ("invocations_invocationrecord", "invocations_runevent")
    if connection.vendor == "postgresql":
        [combined] = [sql for sql in statements if sql.startswith("WITH")]
        assert all(f'"{table}"' in combined for table in writes), combined
    else:
        assert all(any(f'"{table}"' in sql for sql in statements) for table in writes)

    approval.refresh_from_db()
    vote = approval.votes.get()
    assert (approval.status, approval.decided_by, vote.user) == ("approved", operator, operator)
    assert record_of(approval).status == "queued"
    signed = verify_receipt(
        DecisionReceipt.objects.get(approval=approval).receipt, published_keys()
    )
    assert signed["votes"] == [
        {
            "user": operator.get_username(),
            "userId": operator.pk,
            "vote": "approve",
            "boundHash": approval.bound_hash,
            "at": instant(vote.created_at),  # the vote as stored is the vote as signed
        }
    ]
    assert signed["decidedAt"] == instant(approval.decided_at)
    decided = [
        event
        for event in events(caller.tenant, "run-in-time")
        if event["type"] == "approval_decided"
    ]
    assert [(event["decision"], event["decidedBy"]) for event in decided] == [
        ("approve", operator.get_username())
    ]
    assert body["decidedAt"] is not None and len(queue_entries(approval)) == 1


def test_a_reject_writes_the_same_rows_as_an_approval_and_counts_no_vote(caller, operator):
    """A rejection of a call that needs one approval: its vote is the only one (written with
    the request, the receipt and the event), the answer gives 0 approvals, and the call
    ends with the reason without a read of the votes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _, approval = hold(caller, CONFIRM, runId="run-rejected")
    client = logged_in(operator)
    with CaptureQueriesContext(connection) as queries:
        response = post_decision(client, approval.pk, decision="reject", reason="Not today.")
    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["approvalsGiven"]) == ("rejected", 0)
    statements = [q["sql"] for q in queries.captured_queries]
    assert not any("COUNT(" in sql or 'FROM "approvals_vote"' in sql for sql in statements)
    approval.refresh_from_db()
    assert [(v.user, v.decision, v.reason) for v in approval.votes.all()] == [
        (operator, "reject", "Not today.")
    ]
    assert record_of(approval).error_code == "approval_rejected"
    types = [e["type"] for e in events(caller.tenant, "run-rejected")]
    assert types[-1] == "tool_call_result" and types.count("approval_decided") == 1, types
    assert types.index("approval_decided") < types.index("tool_call_result"), types


def test_a_policys_approval_timeout_sets_the_expiry(caller):
    policy = Policy.objects.get(tenant=caller.tenant, name="test tools")
    policy.approval_timeout_minutes = 3
    policy.save()

    _, approval = hold(caller, CONFIRM)

    window = (approval.expires_at - approval.created_at).total_seconds()
    assert 170 <= window <= 190


# ---------------------------------------------------------------- cancelling a running call


def test_cancelling_a_running_approved_call_stops_it_as_cancelled(caller, operator, held_echo):
    Tool.objects.filter(pk=SLEEP).update(timeout_ms=20_000)
    body, approval = hold(caller, SLEEP, args={"seconds": 10})
    post_decision(logged_in(operator), approval.pk)
    worker = start_thread(drain_queue)
    deadline = time.monotonic() + 10
    while record_of(approval).status != "running":
        assert time.monotonic() < deadline, "the approved call never started"
        time.sleep(0.05)
    started = time.monotonic()

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 200, response.content
    worker.join(timeout=15)
    assert not worker.is_alive()
    assert time.monotonic() - started < 5
    record = InvocationRecord.objects.get(pk=body["invocationId"])
    assert (record.status, record.error_code, record.ok) == ("cancelled", "cancelled", False)
    assert record.result is None


def test_a_staff_user_without_the_tenant_cannot_decide_directly(caller):
    _, approval = hold(caller, CONFIRM)
    loner = User.objects.create_user("lone", is_staff=True)
    assign_perm("tools.decide_approval", loner, Tool.objects.get(pk=CONFIRM))

    with pytest.raises(decisions.NotFound):
        decisions.decide(approval.pk, loner, "approve")


def test_cancelling_a_call_a_worker_has_just_claimed_stops_it_instead_of_409(
    caller, operator, held_echo
):
    Tool.objects.filter(pk=SLEEP).update(timeout_ms=20_000)
    body, approval = hold(caller, SLEEP, args={"seconds": 10})
    post_decision(logged_in(operator), approval.pk)
    # A claimed call (approved -> executing) whose start is not recorded yet: workers
    # that claimed before the re-checks left this state (the claim is now in the start's
    # transaction); a cancel must still stop it rather than answer 409.
    ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalStatus.EXECUTING)

    response = caller.client.post(cancel_url(body["invocationId"]))

    assert response.status_code == 200, response.content
    started = time.monotonic()
    record = runner.resume(ApprovalRequest.objects.get(pk=approval.pk))  # the worker goes on
    assert time.monotonic() - started < 5
    assert (record.status, record.error_code) == ("cancelled", "cancelled")


def test_edited_args_over_8_kb_are_400_and_nothing_runs(caller, operator, held_echo):
    _, approval = hold(caller, ECHO, args={"text": "hello"}, runId="run-big-edit")

    response = post_decision(logged_in(operator), approval.pk, args={"text": "x" * 9000})

    assert response.status_code == 400, response.content
    assert "limit is 8192" in response.json()["detail"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
