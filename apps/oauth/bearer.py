"""`Authorization: Bearer` on /mcp/, the run streams and the REST API: an API key, or an
OAuth access token (tokens.py: an external issuer's; server.py: toolhub's own, which the
REST API refuses). Either way the request acts as an API key's caller, so
the runner, sessions, stream budgets and revocation treat both alike."""

from __future__ import annotations

from apps.oauth import server
from apps.oauth.resource import Refusal
from apps.oauth.tokens import key_for_token
from apps.tenants.models import KEY_PREFIX, ApiKey

MISSING = "Authentication required: Authorization: Bearer <API key>."


def key_for(authorization: str | None, resource: str) -> ApiKey:
    """The key a request's Authorization header acts as; Refusal (401 or 403) otherwise."""
    scheme, _, raw = (authorization or "").strip().partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise Refusal(401, "", MISSING)
    if " " in raw:
        raise Refusal(400, "invalid_request", "Malformed Authorization header: use 'Bearer <key>'.")
    return key_for_credential(raw, resource)


def key_for_credential(raw: str, resource: str) -> ApiKey:
    if raw.startswith(KEY_PREFIX):
        key = ApiKey.objects.for_raw_key(raw)
        if key is None:
            raise Refusal(401, "invalid_token", "Invalid or revoked API key.")
        key.touch()
        return key
    if raw.startswith(server.ACCESS_PREFIX):
        return server.key_for_access_token(raw, resource)
    return key_for_token(raw, resource)
