"""A held call's receipt: the approval that let it run (or not), the digest of the
arguments that ran and, when an operator edited them, of the ones first requested."""

from __future__ import annotations

from typing import Any

import pytest
from toolhub_client import verify_receipt

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord
from apps.receipts.body import digest
from apps.receipts.models import DecisionReceipt
from apps.tools.models import Tool
from tests.approvals.support import drain_queue, make_operator, require_approval
from tests.conftest import Agent
from tests.receipts.support import published_keys

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "test__echo"


def held(caller: Agent, text: str) -> ApprovalRequest:
    response = caller.invoke(ECHO, args={"text": text})
    assert response.status_code == 202, response.content
    assert "receipt" not in response.json()  # not ended: no receipt yet
    return ApprovalRequest.objects.get(pk=response.json()["approvalId"])


def receipt_of(approval: ApprovalRequest) -> dict[str, Any]:
    record = InvocationRecord.objects.get(pk=approval.invocation_id)
    return verify_receipt(record.receipt or "", published_keys())


def test_an_edited_approved_call_names_both_argument_digests_and_its_approver(caller: Agent):
    policy = require_approval(caller.tenant, ECHO)
    operator = make_operator("oscar", caller.tenant, tools=(ECHO,))
    approval = held(caller, "rm -rf /")

    decisions.decide(approval.pk, operator, "approve", args={"text": "ls"})
    drain_queue()

    body = receipt_of(approval)
    assert body["outcome"] == {"status": "succeeded", "ok": True, "errorCode": None}
    assert body["args"] == {
        "sha256": digest({"text": "ls", "secret_note": ""}),
        "requestedSha256": digest({"text": "rm -rf /", "secret_note": ""}),
    }
    assert body["decision"]["outcome"] == "require_approval"
    assert body["decision"]["rule"] == policy.label
    approval.refresh_from_db()
    assert body["approval"] == {
        "id": str(approval.pk),
        "status": "executing",
        "decidedBy": operator.pk,
        "decidedAt": body["approval"]["decidedAt"],
        "approvalsRequired": 1,
        "holdReason": approval.hold_reason,
    }
    assert body["approval"]["decidedAt"] <= body["startedAt"]

    fetched = caller.client.get(f"/api/v1/invocations/{approval.invocation_id}/receipt/").json()
    [decided] = [verify_receipt(jws, published_keys()) for jws in fetched["decisions"]]
    assert decided["kind"] == "decision"
    assert decided["decision"] == "approved"
    assert decided["decidedBy"] == "oscar"
    assert decided["args"]["sha256"] == body["args"]["sha256"]
    assert decided["args"]["requestedSha256"] == body["args"]["requestedSha256"]
    assert [(v["user"], v["vote"]) for v in decided["votes"]] == [("oscar", "approve")]
    assert decided["votes"][0]["boundHash"] == approval.bound_hash


def test_a_rejected_call_has_a_receipt_naming_the_rejection(caller: Agent):
    require_approval(caller.tenant, ECHO)
    operator = make_operator("oscar", caller.tenant, tools=(ECHO,))
    approval = held(caller, "drop table")

    decisions.decide(approval.pk, operator, "reject", reason="no")

    body = receipt_of(approval)
    assert body["outcome"] == {"status": "failed", "ok": False, "errorCode": "approval_rejected"}
    assert body["args"] == {"sha256": digest({"text": "drop table", "secret_note": ""})}
    assert body["approval"]["status"] == "rejected"
    assert body["approval"]["decidedBy"] == operator.pk
    [decided] = DecisionReceipt.objects.filter(approval=approval)
    signed = verify_receipt(decided.receipt, published_keys())
    assert (signed["decision"], signed["decidedBy"]) == ("rejected", "oscar")
    assert [(v["user"], v["vote"]) for v in signed["votes"]] == [("oscar", "reject")]


def test_a_quorum_decision_receipt_names_every_approver(caller: Agent):
    policy = require_approval(caller.tenant, ECHO)
    policy.high_consequence_quorum = 2
    policy.save()
    Tool.objects.filter(pk=ECHO).update(consequence_level="high")
    first = make_operator("oscar", caller.tenant, tools=(ECHO,))
    second = make_operator("petra", caller.tenant, tools=(ECHO,))
    approval = held(caller, "deploy")
    assert approval.approvals_required == 2

    decisions.decide(approval.pk, first, "approve")
    assert not DecisionReceipt.objects.filter(approval=approval).exists()  # not decided
    decisions.decide(approval.pk, second, "approve")

    [decided] = DecisionReceipt.objects.filter(approval=approval)
    signed = verify_receipt(decided.receipt, published_keys())
    assert signed["approvalsRequired"] == 2
    assert [(v["user"], v["vote"]) for v in signed["votes"]] == [
        ("oscar", "approve"),
        ("petra", "approve"),
    ]
