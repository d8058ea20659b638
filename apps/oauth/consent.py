"""The consent page of toolhub's own authorization server (server.py).

A signed-in staff member sees the client, and chooses the tenant and principal the client
will act as, from the principals of the tenants where they are a tenant admin (the role
that manages API keys); each choice shows the tools that principal may use. Allowing
makes the authorization code (bound to toolhub's resource); denying sends the client
`access_denied`. Someone who may grant nothing gets a page saying why (403).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django import forms
from django.http import HttpResponse
from oauth2_provider.forms import AllowForm
from oauth2_provider.settings import oauth2_settings
from oauth2_provider.views import AuthorizationView

from apps.oauth.resource import resource_for
from apps.policies.policy import catalog
from apps.policies.setup import existing_service_user, known_principals
from apps.tenants.models import Tenant
from apps.tenants.roles import Role, roles_of, tenants_where

GRANTING_PERMISSION = "tenants.add_apikey"  # tenant admins (roles.ADMIN_PERMISSIONS)


@dataclass(frozen=True)
class Choice:
    tenant: Tenant
    principal: str
    tools: list[str]

    @property
    def value(self) -> str:
        return f"{self.tenant.pk} {self.principal}"


def choices_for(user: Any) -> list[Choice]:
    """Every (tenant, principal) the user may let a client act as, with its tools."""
    found = []
    for tenant in tenants_where(user, GRANTING_PERMISSION).order_by("slug"):
        for principal in known_principals(tenant):
            user_of = existing_service_user(tenant, principal)
            listed = catalog(tenant, principal, user_of) if user_of is not None else []
            tools = [tool.id for tool, _ in listed]  # as tools/list names them
            found.append(Choice(tenant, principal, tools))
    return found


def refusal_reason(user: Any) -> str:
    roles = roles_of(user)
    if not roles:
        return "You have no role in any tenant of toolhub."
    if any(role == Role.ADMIN for role in roles.values()):
        return "Your tenants have no principals yet (issue an API key or write a policy first)."
    names = ", ".join(sorted(Tenant.objects.filter(pk__in=roles).values_list("slug", flat=True)))
    return (
        f"You are not a tenant admin of any tenant (your tenants: {names}); only a tenant's "
        "admins may let a client act as one of its principals."
    )


class ConsentForm(AllowForm):
    act_as = forms.ChoiceField(required=False)


class ConsentView(AuthorizationView):
    template_name = "oauth/consent.html"
    form_class = ConsentForm

    def _resource(self) -> str:
        return resource_for(self.request.scheme or "http", self.request.get_host())

    def get_form(self, form_class: Any = None) -> ConsentForm:
        form = super().get_form(form_class)
        self.choices = choices_for(self.request.user)
        form.fields["act_as"].choices = [(c.value, c.value) for c in self.choices]
        return form

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["choices"] = getattr(self, "choices", [])
        context["resource"] = self._resource()
        if not context["choices"]:
            context["refusal"] = refusal_reason(self.request.user)
        return context

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        if "form" in context and not context.get("choices") and not context.get("error"):
            kwargs["status"] = 403
        return super().render_to_response(context, **kwargs)

    def get(self, request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
        wanted = request.GET.getlist("resource")
        if wanted and wanted != [self._resource()]:
            return self._invalid_target(wanted)
        return super().get(request, *args, **kwargs)

    def _invalid_target(self, wanted: list[str]) -> HttpResponse:
        error = {
            "error": "invalid_target",
            "description": (
                f"This server issues tokens for {self._resource()} only, not for "
                f"{' '.join(wanted)}."
            ),
        }
        return self.render_to_response({"error": error}, status=400)

    def form_valid(self, form: ConsentForm) -> HttpResponse:
        given = form.cleaned_data.get("resource") or ""
        if given and given.split() != [self._resource()]:
            return self._invalid_target(given.split())
        form.cleaned_data["resource"] = self._resource()
        if form.cleaned_data.get("allow"):
            chosen = next(
                (c for c in self.choices if c.value == form.cleaned_data.get("act_as")), None
            )
            if chosen is None:
                form.add_error("act_as", "Choose a principal of a tenant you are an admin of.")
                return self.form_invalid(form)
            self.act_as = (chosen.tenant, chosen.principal)
        return super().form_valid(form)

    def form_invalid(self, form: Any) -> HttpResponse:
        context = self.get_context_data(form=form, application=None)
        return self.render_to_response(context, status=403)

    def redirect(self, redirect_to: str, application: Any) -> HttpResponse:
        """Every authorization response names its issuer (RFC 9207), errors such as
        `access_denied` too: the toolkit adds `iss` to a code's redirect only."""
        parts = urlsplit(redirect_to)
        query = parse_qsl(parts.query, keep_blank_values=True)
        if "error" in dict(query) and "iss" not in dict(query):
            issuer = oauth2_settings.oauth2_authorization_server_issuer(self.request)
            query.append(("iss", issuer))
            redirect_to = urlunsplit(parts._replace(query=urlencode(query)))
        return super().redirect(redirect_to, application)

    def create_authorization_response(
        self, request: Any, scopes: str, credentials: dict[str, Any], allow: bool
    ) -> Any:
        if allow:
            credentials["toolhub_act_as"] = self.act_as
            credentials["toolhub_resource"] = self._resource()
        return super().create_authorization_response(request, scopes, credentials, allow)
