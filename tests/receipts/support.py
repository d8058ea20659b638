"""Receipts as a verifier sees them: the published keys, a receipt's body, a forged one."""

from __future__ import annotations

import base64
import json
from typing import Any

from rest_framework.test import APIClient


def published_keys() -> dict[str, Any]:
    response = APIClient().get("/.well-known/jwks.json")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/jwk-set+json"
    return dict(response.json())


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def parts(receipt: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Header, body (both unverified) and signature of a compact JWS."""
    header, body, signature = receipt.split(".")
    return json.loads(unb64(header)), json.loads(unb64(body)), signature


def with_body(receipt: str, body: dict[str, Any]) -> str:
    """The receipt with another body and its original header and signature: a forgery."""
    header, _, signature = receipt.split(".")
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return f"{header}.{b64(encoded)}.{signature}"


def with_header(receipt: str, header: dict[str, Any], signature: str | None = None) -> str:
    _, body, original = receipt.split(".")
    encoded = b64(json.dumps(header, separators=(",", ":")).encode())
    return f"{encoded}.{body}.{original if signature is None else signature}"
