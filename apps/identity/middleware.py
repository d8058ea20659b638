"""Sessions of the provider's users end when the provider's session does.

mozilla-django-oidc's SessionRefresh: every TOOLHUB_OIDC_RECHECK_SECONDS a page request
of a provider-signed user goes to the provider with prompt=none; a provider whose session
ended (signed out there, disabled there) answers login_required and the callback signs
the user out here too. Their groups are read again on the way, so a removed group takes
its role away then, not only at the next full sign-in. API, MCP and stream paths, and a
page's own fetches (Sec-Fetch-Mode other than navigate), are left alone: a redirect to the
provider means nothing to a script.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from mozilla_django_oidc.middleware import SessionRefresh

from apps.identity import provider


class ProviderSessionCheck(SessionRefresh):
    # The library's __init__ reads the authorization endpoint; this one is read when
    # a check is due (the setter takes the library's assignment and keeps nothing).
    @property
    def OIDC_OP_AUTHORIZATION_ENDPOINT(self) -> str:
        return provider.endpoint("authorization_endpoint")

    @OIDC_OP_AUTHORIZATION_ENDPOINT.setter
    def OIDC_OP_AUTHORIZATION_ENDPOINT(self, value: Any) -> None:
        pass

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        if attr == "OIDC_OP_AUTHORIZATION_ENDPOINT":
            return ""
        return SessionRefresh.get_settings(attr, *args)

    def is_refreshable_url(self, request: HttpRequest) -> bool:
        # Only page loads: a script's fetch (the console's polling) cannot follow a
        # redirect to the provider; the next page load checks instead.
        navigation = request.headers.get("Sec-Fetch-Mode", "navigate") == "navigate"
        return navigation and bool(super().is_refreshable_url(request))

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not provider.enabled():
            return None
        try:
            response: HttpResponse | None = super().process_request(request)
        except provider.ProviderUnavailable:
            return None  # the provider is down: the session stands until it answers
        return response
