"""What a receipt says: its body, built from a call's record and what its checks learnt.

Canonical JSON, for the body that is signed and for every digest in it: keys sorted,
no whitespace, UTF-8, non-ASCII characters as themselves (Python's
`json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`). For JSON
whose numbers are integers of at most 2**53 and whose object keys lie in the Basic
Multilingual Plane, that is exactly RFC 8785 (JCS), so any JCS library recomputes the
digests; toolhub does not use a JCS library itself because the pure-Python one cost
0.6 ms per result where this costs 0.08 (bench/receipts.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from apps.receipts.keys import instant

if TYPE_CHECKING:
    from apps.approvals.models import ApprovalRequest, Vote
    from apps.invocations.models import InvocationRecord

VERSION = 1
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode()


def digest(value: Any) -> str:
    """SHA-256 of the canonical JSON of `value`, hex."""
    return hashlib.sha256(canonical(value)).hexdigest()


@dataclass(frozen=True)
class Facts:
    """What the runner knew of a call beyond its record: None where it never learnt it
    (a call refused before its tool was found, or its arguments validated)."""

    schema_hash: str | None = None
    args: dict[str, Any] | None = None  # the validated arguments that ran (unredacted)
    decision: str | None = None  # allow | deny | require_approval
    policy_version: str | None = None
    approval: ApprovalRequest | None = None


def call_body(record: InvocationRecord, facts: Facts, signed_at: datetime) -> dict[str, Any]:
    """The body of a finished call's receipt (docs/receipts.md lists every field)."""
    approval = facts.approval
    ran = facts.args if facts.args is not None else (approval.args if approval else None)
    args: dict[str, Any] = {"sha256": digest(ran) if ran is not None else None}
    if approval is not None and approval.original_args != ran:
        args["requestedSha256"] = digest(approval.original_args)
    body: dict[str, Any] = {
        "v": VERSION,
        "kind": "call",
        "invocationId": str(record.pk),
        "toolCallId": record.tool_call_id,
        "runId": record.run_id,
        "tenant": record.tenant.slug,
        "principal": record.principal,
        "tool": {"id": record.tool_ref, "schemaHash": facts.schema_hash},
        "args": args,
        "connectionId": record.connection_id or None,
        "decision": {
            "outcome": facts.decision,
            "rule": record.policy_rule or None,
            "policyVersion": facts.policy_version,
        },
        "approval": _approval(approval) if approval is not None else None,
        "startedAt": _maybe(record.started_at),
        "endedAt": _maybe(record.ended_at),
        "signedAt": instant(signed_at),
        "outcome": {
            "status": record.status,
            "ok": record.ok,
            "errorCode": record.error_code or None,
        },
        "resultSha256": digest(record.result) if record.result is not None else None,
    }
    return body


def _approval(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "id": str(approval.pk),
        "status": approval.status,
        "decidedBy": approval.decided_by_id,
        "decidedAt": _maybe(approval.decided_at),
        "approvalsRequired": approval.approvals_required,
        "holdReason": approval.hold_reason,
    }


def _maybe(value: datetime | None) -> str | None:
    return instant(value) if value is not None else None


def decision_body(
    approval: ApprovalRequest, votes: list[Vote], decided_by: str | None, signed_at: datetime
) -> dict[str, Any]:
    """The body of a held call's decision receipt: the arguments it binds (and those first
    requested, if edited), every vote with its operator, and the outcome of the decision."""
    args: dict[str, Any] = {"sha256": digest(approval.args), "boundHash": approval.bound_hash}
    if approval.original_args != approval.args:
        args["requestedSha256"] = digest(approval.original_args)
    return {
        "v": VERSION,
        "kind": "decision",
        "approvalId": str(approval.pk),
        "invocationId": str(approval.invocation_id),
        "toolCallId": approval.tool_call_id,
        "runId": approval.run_id,
        "tenant": approval.tenant.slug,
        "principal": approval.principal,
        "tool": {"id": approval.tool_id},
        "args": args,
        "connectionId": approval.connection_id or None,
        "rule": approval.policy_rule or None,
        "holdReason": approval.hold_reason,
        "approvalsRequired": approval.approvals_required,
        "fourEyes": approval.four_eyes,
        "votes": [
            {
                "user": vote.user.get_username(),
                "userId": vote.user_id,
                "vote": vote.decision,
                "boundHash": vote.bound_hash,
                "at": instant(vote.created_at),
            }
            for vote in votes
        ],
        "decision": approval.status,
        "decidedBy": decided_by,
        "decidedAt": _maybe(approval.decided_at),
        "signedAt": instant(signed_at),
    }
