"""Tells drf-spectacular how API keys authenticate, so the schema and docs offer it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"
    match_subclasses = True  # apps.oauth's BearerAuthentication also takes OAuth tokens

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "An API key, or an OAuth access token for toolhub's resource "
                "(docs/oauth.md): `Authorization: Bearer <key or token>`."
            ),
        }
