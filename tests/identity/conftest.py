"""Staff sign-in against the real OpenID provider (tests/identity/provider.py).

`signed_in_as(client, login, password)` walks the whole sign-in: toolhub's start view
redirects to the provider, the provider's login form is filled (over HTTP, as a browser
would post it), and the provider's redirect comes back to toolhub's callback, which talks
to the provider's token, JWKS and userinfo endpoints itself.
"""

from __future__ import annotations

import http.cookiejar
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.test.utils import override_settings

from apps.identity import provider as configured
from apps.tenants.models import Role, Tenant
from tests.identity.provider import OpenIDProvider, oidc_provider

__all__ = ["oidc_provider"]

CLIENT_ID = "toolhub-staff"
CLIENT_SECRET = "toolhub-staff-secret"
CALLBACK = "http://testserver/oidc/callback/"
BACKEND = "apps.identity.backends.OpenIDBackend"


def oidc_settings(issuer: str, secret: str = CLIENT_SECRET) -> dict[str, Any]:
    """The settings TOOLHUB_OIDC_* give (toolhub/settings.py), for an in-process client."""
    from django.conf import settings

    middleware = list(settings.MIDDLEWARE)
    at = middleware.index("django.contrib.messages.middleware.MessageMiddleware") + 1
    middleware.insert(at, "apps.identity.middleware.ProviderSessionCheck")
    return {
        "TOOLHUB_OIDC_ISSUER": issuer,
        "TOOLHUB_OIDC_NAME": "Test IdP",
        "OIDC_RP_CLIENT_ID": CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": secret,
        "OIDC_RP_SCOPES": "openid email profile groups",
        "AUTHENTICATION_BACKENDS": [*settings.AUTHENTICATION_BACKENDS, BACKEND],
        "MIDDLEWARE": middleware,
    }


@pytest.fixture
def idp(oidc_provider: OpenIDProvider) -> Iterator[OpenIDProvider]:
    """The provider, with toolhub's staff client registered and toolhub pointed at it."""
    oidc_provider.add_client(
        CLIENT_ID,
        CLIENT_SECRET,
        redirect_uris=[CALLBACK],
        post_logout_redirect_uris=["http://testserver/admin/login/"],
    )
    configured.forget()
    with override_settings(**oidc_settings(oidc_provider.issuer)):
        yield oidc_provider
    configured.forget()


@pytest.fixture
def tenants(db: None) -> dict[str, Tenant]:
    return {
        slug: Tenant.objects.create(slug=slug, name=slug.title()) for slug in ("acme", "globex")
    }


def start(client: Client, next_url: str = "/admin/") -> str:
    response = client.get(f"/oidc/authenticate/?next={next_url}")
    assert response.status_code == 302, response.content[:500]
    return str(response["Location"])


def back_to_toolhub(client: Client, url: str) -> Any:
    """Hand the provider's redirect to toolhub's callback."""
    parts = urlsplit(url)
    return client.get(f"{parts.path}?{parts.query}")


SignIn = Callable[..., Any]


@pytest.fixture
def sign_in(idp: OpenIDProvider) -> SignIn:
    def run(
        client: Client,
        login: str,
        password: str,
        jar: http.cookiejar.CookieJar | None = None,
    ) -> Any:
        url = idp.follow(start(client), login, password, until=CALLBACK, jar=jar)
        return back_to_toolhub(client, url)

    return run


def roles(user: Any) -> dict[str, Role]:
    return {m.tenant.slug: Role(m.role) for m in user.memberships.select_related("tenant")}
