"""Signing a finished call's receipt: one Ed25519 signature over its canonical body."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone

from apps.receipts import keys
from apps.receipts.body import Facts, call_body, canonical, decision_body
from apps.receipts.models import DecisionReceipt

if TYPE_CHECKING:
    from apps.approvals.models import ApprovalRequest, Vote
    from apps.invocations.models import InvocationRecord


def sign_call(record: InvocationRecord, facts: Facts, signer: keys.Signer | None = None) -> str:
    """The compact JWS of the record's receipt, as it ends. `signer`: the key chosen at
    the call's checks (keys.signer(), no query of its own); else the current one."""
    signer = signer or keys.signer()
    return signer.sign(canonical(call_body(record, facts, timezone.now())))


def decision_receipt(
    approval: ApprovalRequest, decided_by: str | None, votes: list[Vote] | None = None
) -> DecisionReceipt:
    """A held call's decision receipt, signed and not saved yet: the decision writes it in
    its own transaction, with its other rows. `votes`: every vote of the request, when
    the decision knows them (its one vote); else they are read."""
    if votes is None:
        votes = list(approval.votes.select_related("user").order_by("created_at", "pk"))
    body = decision_body(approval, votes, decided_by, timezone.now())
    return DecisionReceipt(approval=approval, receipt=keys.signer().sign(canonical(body)))
