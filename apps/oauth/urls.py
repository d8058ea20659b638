from django.urls import path

from apps.oauth import views

urlpatterns = [
    path("oauth-protected-resource", views.protected_resource, name="oauth-protected-resource"),
    path(
        "oauth-protected-resource/mcp",
        views.protected_resource,
        name="oauth-protected-resource-mcp",
    ),
]
