"""The protected resource metadata (RFC 9728), public: clients read it before any token."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from apps.oauth.resource import metadata, resource_for


@require_safe
def protected_resource(request: HttpRequest) -> JsonResponse:
    """Both /.well-known/oauth-protected-resource and its form for the MCP path (/mcp):
    MCP clients try the path-suffixed one first, then the root (2025-11-25)."""
    document = metadata(resource_for(request.scheme or "http", request.get_host()))
    response = JsonResponse(document)
    # Browser-based clients (the MCP Inspector's web UI) read it from another origin;
    # it holds nothing secret.
    response["Access-Control-Allow-Origin"] = "*"
    response["Cache-Control"] = "public, max-age=3600"
    return response
