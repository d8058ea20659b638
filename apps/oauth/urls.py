from django.urls import path

from apps.oauth import views

urlpatterns = [
    path("oauth-protected-resource", views.protected_resource, name="oauth-protected-resource"),
    path(
        "oauth-protected-resource/mcp",
        views.protected_resource,
        name="oauth-protected-resource-mcp",
    ),
    # RFC 8414, for the issuer <origin> (server.issuer_of); MCP clients try this first.
    path(
        "oauth-authorization-server",
        views.authorization_server,
        name="oauth-authorization-server",
    ),
]
