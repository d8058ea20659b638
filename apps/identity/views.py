"""Staff sign-in with the provider: start, callback, sign-out (thin: the rules are in
apps/identity/signin.py and backends.py)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, auth, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from apps.identity import provider
from apps.identity.backends import OpenIDBackend
from apps.identity.signin import NoTenant, Outcome, SignInRefused

logger = logging.getLogger(__name__)
BACKEND = f"{OpenIDBackend.__module__}.{OpenIDBackend.__qualname__}"


def refused(request: HttpRequest, reason: str, outcome: Outcome | None = None) -> HttpResponse:
    logger.warning("OpenID sign-in refused: %s", reason)
    return render(
        request,
        "identity/refused.html",
        {"reason": reason, "outcome": outcome, "provider_name": settings.TOOLHUB_OIDC_NAME},
        status=403,
    )


class SignInStart(OIDCAuthenticationRequestView):
    def __init__(self, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the endpoint at once.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    @property
    def OIDC_OP_AUTH_ENDPOINT(self) -> str:
        return provider.endpoint("authorization_endpoint")

    def get(self, request: HttpRequest) -> HttpResponse:
        if not provider.enabled():
            return refused(request, "Sign-in with an identity provider is not configured here.")
        try:
            response: HttpResponse = super().get(request)
        except provider.ProviderUnavailable as error:
            return refused(request, str(error))
        return response


class SignInCallback(OIDCAuthenticationCallbackView):
    def get(self, request: HttpRequest) -> HttpResponse:
        if not provider.enabled():
            return refused(request, "Sign-in with an identity provider is not configured here.")
        try:
            mixup = self._issuer_problem(request)
            if mixup:
                return self._refused(mixup)
            if request.GET.get("error") and request.user.is_authenticated:
                # prompt=none found no session at the provider: it ended there.
                response: HttpResponse = super().get(request)
                messages.info(request, "Your session at the identity provider ended: sign in.")
                return response
            if request.GET.get("error"):
                error = request.GET.get("error_description") or request.GET["error"]
                super().get(request)
                return refused(request, f"The identity provider answered: {error}")
            response = super().get(request)
        except NoTenant as no_tenant:
            return self._refused("", no_tenant.outcome)
        except (SignInRefused, provider.ProviderUnavailable) as error:
            return self._refused(str(error))
        outcome: Outcome | None = getattr(request, "oidc_outcome", None)
        if outcome is not None and request.user.is_authenticated:
            for group, slug in outcome.missing_tenants:
                messages.warning(
                    request,
                    f"Your group {group} names tenant {slug}, which does not exist here; "
                    "it gives you no role.",
                )
        return response

    def _refused(self, reason: str, outcome: Outcome | None = None) -> HttpResponse:
        # A session re-check that fails ends the session it was checking.
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        return refused(self.request, reason, outcome)

    @staticmethod
    def _issuer_problem(request: HttpRequest) -> str:
        """RFC 9207: the authorization response names its issuer; it must be ours."""
        sent = request.GET.get("iss")
        if sent is not None and sent != provider.issuer():
            return (
                f"The sign-in answer came from issuer {sent!r}, not {provider.issuer()!r}; "
                "refused (a mix-up of providers)."
            )
        if sent is None and provider.discovery().get(
            "authorization_response_iss_parameter_supported"
        ):
            return "The sign-in answer does not name its issuer (iss), which the provider promises."
        return ""

    def login_failure(self) -> HttpResponse:
        if self.request.GET.get("code"):
            return refused(self.request, "The sign-in answer is not valid here (state or user).")
        return super().login_failure()


def provider_logout_url(request: HttpRequest) -> str:
    """Where sign-out sends a provider's user: the provider's end-session endpoint
    (RP-initiated logout), back to the login page; the login page itself without one."""
    back = request.build_absolute_uri(reverse("admin:login"))
    try:
        end = provider.endpoint("end_session_endpoint")
    except provider.ProviderUnavailable:
        end = ""
    if not end:
        return back
    query = {"client_id": settings.OIDC_RP_CLIENT_ID, "post_logout_redirect_uri": back}
    if request.session.get("oidc_id_token"):
        query["id_token_hint"] = request.session["oidc_id_token"]
    return f"{end}?{urlencode(query)}"


def logout(request: HttpRequest) -> HttpResponse:
    """/admin/logout/: a provider's user leaves the provider's session too."""
    if request.method == "POST" and request.session.get(auth.BACKEND_SESSION_KEY) == BACKEND:
        url = provider_logout_url(request)
        auth.logout(request)
        return HttpResponseRedirect(url)
    response: HttpResponse = admin.site.admin_view(admin.site.logout)(request)
    return response
