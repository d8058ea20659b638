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
