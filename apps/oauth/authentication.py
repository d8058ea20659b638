"""DRF authentication with `Authorization: Bearer`: an API key, or an OAuth access token
(apps.oauth.bearer). Refusals carry RFC 6750's challenge with the resource metadata."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.request import Request

from apps.oauth import server
from apps.oauth.bearer import MISSING, key_for_credential
from apps.oauth.resource import Refusal, challenge, resource_for
from apps.tenants.authentication import ApiKeyAuthentication
from apps.tenants.callers import ApiPrincipal
from apps.tenants.models import ApiKey

NOT_HERE = (
    "toolhub's OAuth access tokens work on /mcp/ and the run streams only, not on the REST "
    "API: use an API key here."
)


class BearerRefused(exceptions.APIException):
    """A 403 (insufficient scope) or 503 (issuer unreadable), with its challenge."""

    def __init__(self, refusal: Refusal, auth_header: str) -> None:
        self.status_code = refusal.status
        super().__init__(refusal.description)
        if refusal.status == 403:
            self.auth_header = auth_header  # DRF's handler sends it as WWW-Authenticate


class BearerAuthentication(ApiKeyAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        parts = get_authorization_header(request).decode("latin-1").split()
        if not parts or parts[0].lower() != self.keyword.lower():  # blank header: no credentials
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: use 'Bearer <key>'."
            )
        resource = _resource(request)
        if parts[1].startswith(server.ACCESS_PREFIX):
            # Tokens of toolhub's own server are for MCP clients: /mcp/ and the run streams.
            request._bearer_refusal = Refusal(401, "invalid_token", NOT_HERE)  # type: ignore[attr-defined]
            raise exceptions.AuthenticationFailed(NOT_HERE)
        try:
            key = key_for_credential(parts[1], resource)
        except Refusal as refusal:
            if refusal.status != 401:
                raise BearerRefused(refusal, challenge(refusal, resource)) from None
            request._bearer_refusal = refusal  # type: ignore[attr-defined]  # for the header
            raise exceptions.AuthenticationFailed(refusal.description) from None
        return ApiPrincipal(key), key

    def authenticate_header(self, request: Request) -> str:
        refusal = getattr(request, "_bearer_refusal", None) or Refusal(401, "", MISSING)
        return challenge(refusal, _resource(request))


def _resource(request: Request) -> str:
    return resource_for(request.scheme or "http", request.get_host())
