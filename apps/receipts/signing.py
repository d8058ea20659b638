"""Signing a finished call's receipt: one Ed25519 signature over its canonical body."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone

from apps.receipts import keys
from apps.receipts.body import Facts, call_body, canonical

if TYPE_CHECKING:
    from apps.invocations.models import InvocationRecord


def sign_call(record: InvocationRecord, facts: Facts, signer: keys.Signer | None = None) -> str:
    """The compact JWS of the record's receipt, as it ends. `signer`: the key chosen at
    the call's checks (keys.signer(), no query of its own); else the current one."""
    signer = signer or keys.signer()
    return signer.sign(canonical(call_body(record, facts, timezone.now())))
