"""toolhub's own authorization server's endpoints (server.py), under /oauth/; each answers
404 while TOOLHUB_OAUTH_SERVER is off. The namespace is django-oauth-toolkit's, whose
metadata view names them."""

from django.urls import path
from oauth2_provider import views as toolkit

from apps.oauth.consent import ConsentView
from apps.oauth.views import registration, when_server_enabled

app_name = "oauth2_provider"

urlpatterns = [
    path("authorize/", when_server_enabled(ConsentView.as_view()), name="authorize"),
    path("token/", when_server_enabled(toolkit.TokenView.as_view()), name="token"),
    path("revoke/", when_server_enabled(toolkit.RevokeTokenView.as_view()), name="revoke-token"),
    path(
        "register/",
        registration,
        name="dcr-register",
    ),
    path(
        "register/<str:client_id>/",
        when_server_enabled(toolkit.DynamicClientRegistrationManagementView.as_view()),
        name="dcr-register-management",
    ),
]
