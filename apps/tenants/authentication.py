"""DRF authentication with `Authorization: Bearer <api key>`."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.tenants.callers import ApiPrincipal
from apps.tenants.models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts or parts[0].lower() != self.keyword.lower():  # blank header: no credentials
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: use 'Bearer <key>'."
            )
        key = ApiKey.objects.for_raw_key(parts[1])
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        key.touch()
        return ApiPrincipal(key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="toolhub"'
