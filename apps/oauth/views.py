"""The protected resource metadata (RFC 9728) and, when toolhub's own authorization server
is on, its metadata (RFC 8414): public, clients read them before any token."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from oauth2_provider.views import DynamicClientRegistrationView, OAuthServerMetadataView

from apps.oauth.resource import metadata, resource_for
from apps.oauth.server import plaintext_redirect_problem


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


def when_server_enabled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The view of toolhub's own authorization server, or 404 while it is off."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.TOOLHUB_OAUTH_SERVER:
            raise Http404("toolhub's authorization server is off (TOOLHUB_OAUTH_SERVER).")
        return view(request, *args, **kwargs)

    return wrapped


authorization_server = when_server_enabled(OAuthServerMetadataView.as_view())


@csrf_exempt  # an API endpoint, like the toolkit's own view
def _registration(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """RFC 7591 registration, refusing a plain-http redirect URI to another machine up
    front (RFC 7591 §3.2.2 `invalid_redirect_uri`): the authorization endpoint would
    never send a code there, and a client should learn it when it registers."""
    if request.method == "POST":
        try:
            uris = json.loads(request.body or b"{}").get("redirect_uris") or []
        except (ValueError, AttributeError):
            uris = []  # the toolkit answers a malformed body itself
        for uri in uris if isinstance(uris, list) else []:
            problem = plaintext_redirect_problem(uri) if isinstance(uri, str) else None
            if problem:
                return JsonResponse(
                    {"error": "invalid_redirect_uri", "error_description": problem}, status=400
                )
    return DynamicClientRegistrationView.as_view()(request, *args, **kwargs)


registration = when_server_enabled(_registration)
