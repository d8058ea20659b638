"""Verifying toolhub's signed receipts, with no trust in toolhub's database.

A receipt is a compact JWS (RFC 7515) signed with Ed25519 (`alg` "Ed25519", RFC 9864);
its key is one of the JWKS toolhub publishes at /.well-known/jwks.json. The rules, the
same as toolhub's own (apps/receipts/verification.py):

- the header's `alg` must be "Ed25519": "none", an HMAC keyed with the public key
  ("HS256") and every other algorithm are refused before any key is used;
- its `kid` must name a published key;
- the signature must verify with that key (a changed argument digest, outcome or any
  other byte of the body breaks it);
- a rotated-out key (`toolhub_retires_at` in its JWK) vouches only for receipts signed
  before it retired (the body's `signedAt`).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from datetime import datetime
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

ALG = "Ed25519"


class ReceiptError(Exception):
    """The receipt does not verify; the message says why."""


def fetch_jwks(base_url: str, timeout: float = 10) -> dict[str, Any]:
    """toolhub's published receipt keys (no API key needed)."""
    url = f"{base_url.rstrip('/')}/.well-known/jwks.json"
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - caller's URL
        jwks: dict[str, Any] = json.loads(response.read())
    return jwks


def verify_receipt(receipt: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The receipt's body, once its signature verifies against `jwks`; ReceiptError if not."""
    header = _header(receipt)
    if header.get("alg") != ALG:
        raise ReceiptError(f"Refused: alg {header.get('alg')!r}; toolhub receipts are {ALG}.")
    kid = header.get("kid")
    published = {key.get("kid"): key for key in jwks.get("keys", []) if isinstance(key, dict)}
    if not isinstance(kid, str) or kid not in published:
        raise ReceiptError(f"Unknown kid {kid!r}: the JWKS has no such key.")
    jwk = published[kid]
    try:
        key = OKPKey.import_key({name: jwk[name] for name in ("kty", "crv", "x")})
        verified = jws.deserialize_compact(receipt, key, algorithms=[ALG])
    except JoseError as exc:
        raise ReceiptError(f"The signature does not verify: {exc.description or exc}") from None
    except (KeyError, ValueError) as exc:
        raise ReceiptError(f"The published key {kid} is unusable: {exc}") from None
    body: dict[str, Any] = json.loads(verified.payload)
    retired = jwk.get("toolhub_retires_at")
    if retired is not None and _instant(body.get("signedAt")) >= _instant(retired):
        raise ReceiptError(
            f"Signed at {body.get('signedAt')}, after its key {kid} retired ({retired})."
        )
    return body


def _header(receipt: str) -> dict[str, Any]:
    parts = receipt.split(".") if isinstance(receipt, str) else []
    if len(parts) != 3:
        raise ReceiptError("Not a compact JWS: it needs three dot-separated parts.")
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, TypeError):
        raise ReceiptError("Not a compact JWS: its header is not base64url JSON.") from None
    if not isinstance(header, dict):
        raise ReceiptError("Not a compact JWS: its header is not a JSON object.")
    return header


def _instant(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ReceiptError(f"Not an instant: {value!r}") from None
