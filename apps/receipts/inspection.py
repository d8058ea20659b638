"""A receipt as the console shows it: its key, its body, and whether it verifies now
against the published keys (the same check a verifier elsewhere makes)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from apps.receipts import keys
from apps.receipts.verification import ReceiptInvalid, header_of, verify


@dataclass(frozen=True)
class Inspected:
    kid: str
    alg: str
    valid: bool
    problem: str  # why it does not verify ("" when it does)
    body: dict[str, Any]


def inspect(receipt: str) -> Inspected:
    try:
        header = header_of(receipt)
    except ReceiptInvalid as exc:
        return Inspected("", "", False, str(exc), {})
    try:
        body, problem = verify(receipt, keys.jwks()), ""
    except ReceiptInvalid as exc:
        body, problem = _unverified_body(receipt), str(exc)
    return Inspected(
        str(header.get("kid", "")), str(header.get("alg", "")), not problem, problem, body
    )


def _unverified_body(receipt: str) -> dict[str, Any]:
    """Shown beside the reason it failed: an operator sees what it claims."""
    part = receipt.split(".")[1]
    try:
        body = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
