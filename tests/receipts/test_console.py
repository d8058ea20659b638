"""The console's approval page shows the call's receipt: its key, its decoded body, and
whether its signature verifies against the published keys."""

from __future__ import annotations

import html

import pytest

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord
from tests.approvals.support import drain_queue, logged_in, make_operator, require_approval
from tests.conftest import Agent
from tests.receipts.support import parts, with_body

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "test__echo"


def test_the_approval_page_shows_the_receipt_and_whether_it_verifies(caller: Agent):
    require_approval(caller.tenant, ECHO)
    operator = make_operator("oscar", caller.tenant, tools=(ECHO,))
    approval = ApprovalRequest.objects.get(
        pk=caller.invoke(ECHO, args={"text": "hi"}).json()["approvalId"]
    )
    page = f"/console/approvals/{approval.pk}/"
    console = logged_in(operator)
    assert 'id="receipt"' not in console.get(page).content.decode()  # held: none yet

    decisions.decide(approval.pk, operator, "approve")
    drain_queue()
    record = InvocationRecord.objects.get(pk=approval.invocation_id)
    shown = html.unescape(console.get(page).content.decode())

    header, body, _ = parts(record.receipt or "")
    assert 'id="receipt-valid">signature valid<' in shown
    assert f'id="receipt-kid">{header["kid"]}<' in shown
    assert f'"invocationId": "{record.pk}"' in shown
    assert f'"sha256": "{body["args"]["sha256"]}"' in shown

    record.receipt = with_body(record.receipt or "", {**body, "principal": "agent:other"})
    record.save(update_fields=["receipt"])
    outcome = console.get(f"/console/approvals/{approval.pk}/outcome/")
    tampered = html.unescape(outcome.content.decode())

    assert 'id="receipt-valid">does not verify<' in tampered
    assert "The signature does not verify" in tampered
    assert '"principal": "agent:other"' in tampered
