"""The published keys: a JWKS at a well-known address, for anyone who verifies receipts."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from apps.receipts import keys


@require_GET
def jwks(request: HttpRequest) -> JsonResponse:
    """Every receipt key, rotated-out ones included; public, and cacheable for a while
    (a new key signs only from a rotation on, so a verifier that sees an unknown kid
    fetches this again)."""
    response = JsonResponse(keys.jwks())
    response["Content-Type"] = "application/jwk-set+json"
    response["Cache-Control"] = "public, max-age=300"
    return response
