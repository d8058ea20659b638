"""Checking a receipt against the published keys, as any verifier should.

The same rules as toolhub_client.verify_receipt (clients/python), for the console:
the header must say `alg` "Ed25519" (not "none", not an HMAC keyed with the public key,
not "EdDSA": one algorithm, no negotiation), its `kid` must be a published key, the
signature must verify with that key, and a rotated-out key's receipt must have been
signed before the key's `toolhub_retires_at`.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from apps.receipts.keys import ALG


class ReceiptInvalid(Exception):
    """The receipt does not verify; the message says why."""


def header_of(token: str) -> dict[str, Any]:
    """The protected header, unverified (to find the key; to show it)."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3:
        raise ReceiptInvalid("Not a compact JWS: it needs three dot-separated parts.")
    try:
        padded = parts[0] + "=" * (-len(parts[0]) % 4)
        header = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, TypeError):
        raise ReceiptInvalid("Not a compact JWS: its header is not base64url JSON.") from None
    if not isinstance(header, dict):
        raise ReceiptInvalid("Not a compact JWS: its header is not a JSON object.")
    return header


def verify(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The receipt's body if it verifies against `jwks`; else ReceiptInvalid."""
    header = header_of(token)
    if header.get("alg") != ALG:
        raise ReceiptInvalid(f"Refused: alg {header.get('alg')!r}; receipts are signed {ALG}.")
    kid = header.get("kid")
    published = {key.get("kid"): key for key in jwks.get("keys", []) if isinstance(key, dict)}
    if not isinstance(kid, str) or kid not in published:
        raise ReceiptInvalid(f"Unknown kid {kid!r}: no published key has it.")
    jwk = published[kid]
    try:
        key = OKPKey.import_key({name: jwk[name] for name in ("kty", "crv", "x")})
        verified = jws.deserialize_compact(token, key, algorithms=[ALG])
    except JoseError as exc:
        raise ReceiptInvalid(f"The signature does not verify: {exc.description or exc}") from None
    except (KeyError, ValueError) as exc:
        raise ReceiptInvalid(f"The published key {kid} is unusable: {exc}") from None
    body = json.loads(verified.payload)
    retires_at = jwk.get("toolhub_retires_at")
    if retires_at is not None and _at(body.get("signedAt")) >= _at(retires_at):
        raise ReceiptInvalid(
            f"Signed at {body.get('signedAt')}, after its key {kid} retired ({retires_at})."
        )
    return dict(body)


def _at(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ReceiptInvalid(f"Not an instant: {value!r}") from None
