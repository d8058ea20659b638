from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from apps.invocations import runner
from apps.invocations.requests import InvocationRequest
from apps.policies import setup
from apps.policies.forms import SETUP_PERMISSIONS, PolicyRuleForm, SetupForm, SimulationForm
from apps.policies.models import Policy, PolicyRule
from apps.tenants.admin import ScopedChoicesMixin, TenantScopedAdmin
from apps.tenants.callers import UnknownPrincipal, on_behalf
from apps.tenants.scoping import staff_tenants, tenants_allowing
from apps.tools.models import Effect


class PolicyForm(forms.ModelForm[Policy]):
    approval_effects = forms.MultipleChoiceField(
        choices=Effect.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Calls of tools with these effects wait for a human.",
    )

    class Meta:
        model = Policy
        fields = [
            "tenant", "name", "description", "enabled", "group", "principal", "tools",
            "tool_patterns", "approval_effects", "max_runtime_ms", "max_result_bytes",
            "calls_per_minute", "approval_timeout_minutes", "four_eyes", "high_consequence_quorum",
        ]  # fmt: skip


class PolicyRuleInline(ScopedChoicesMixin, admin.TabularInline[PolicyRule, Policy]):
    model = PolicyRule
    form = PolicyRuleForm
    extra = 0
    fields = ("position", "tool_pattern", "condition", "outcome", "description")
    template = "admin/policies/policy/rules_inline.html"


@admin.register(Policy)
class PolicyAdmin(TenantScopedAdmin):
    """Policies, plus the pages that spare admins from assembling access by hand:
    the setup page (one form for the four gates), the page per principal (what it may
    use and why) and the dry run (what a call would do). All are tenant-scoped: the
    forms offer only the staff member's tenants, and the principal page 404s for others.
    """

    form = PolicyForm
    change_list_template = "admin/policies/policy/change_list.html"
    list_display = ("name", "tenant", "group", "principal", "enabled", "updated_at")
    list_filter = ("tenant", "enabled")
    search_fields = ("name", "description", "principal")
    filter_horizontal = ("tools",)
    inlines = [PolicyRuleInline]
    actions = ("enable_policies", "disable_policies")
    fieldsets = (
        (None, {"fields": ("tenant", "name", "description", "enabled")}),
        ("Who it applies to", {"fields": ("group", "principal")}),
        ("What it allows", {"fields": ("tools", "tool_patterns", "approval_effects")}),
        ("Budgets", {"fields": ("max_runtime_ms", "max_result_bytes", "calls_per_minute")}),
        (
            "Human approval",
            {"fields": ("approval_timeout_minutes", "four_eyes", "high_consequence_quorum")},
        ),
    )

    @admin.action(description="Enable selected policies", permissions=["change"])
    def enable_policies(self, request: HttpRequest, queryset: QuerySet[Policy]) -> None:
        # `queryset` is already this staff member's tenants' rows only (get_queryset).
        queryset.update(enabled=True)

    @admin.action(description="Disable selected policies", permissions=["change"])
    def disable_policies(self, request: HttpRequest, queryset: QuerySet[Policy]) -> None:
        queryset.update(enabled=False)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("setup/", view(self.setup_view), name="policies_policy_setup"),
            path("principals/", view(self.principals_view), name="policies_policy_principals"),
            path("principal/", view(self.principal_view), name="policies_policy_principal"),
            path("simulate/", view(self.simulate_view), name="policies_policy_simulate"),
            *super().get_urls(),
        ]

    def setup_view(self, request: HttpRequest) -> HttpResponse:
        """Let principal P use tool T (with connection C, held or not), in one form."""
        user = request.user
        if not tenants_allowing(user, *SETUP_PERMISSIONS).exists():
            raise PermissionDenied  # no tenant where their role may add policies and grants
        form = SetupForm(user, request.POST or None, initial=request.GET.dict())  # type: ignore[arg-type]
        report = None
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                report = setup.grant_tool(
                    data["tenant"],
                    data["principal"],
                    data["tool"],
                    data["connection"],
                    approval=data["approval"],
                )
            except setup.SetupError as exc:
                form.add_error(None, str(exc))
            else:
                done = "Set up" if report.changed else "Nothing to change: everything exists"
                messages.success(request, f"{done} for {data['principal']} and {data['tool'].id}.")
        access = None
        if form.is_valid() or report is not None:
            access = setup.access_of(form.cleaned_data["tenant"], form.cleaned_data["principal"])
        return self._render(
            request, "setup.html", "Let a principal use a tool", form=form, report=report,
            access=access, principals=self._principals_by_tenant(request),
        )  # fmt: skip

    def principals_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return self._render(
            request, "principals.html", "Principals", principals=self._principals_by_tenant(request)
        )

    def principal_view(self, request: HttpRequest) -> HttpResponse:
        """What one principal may use, and why (each gate it passes or fails)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        tenants = staff_tenants(request.user, "policies.view_policy")
        tenant = tenants.filter(slug=request.GET.get("tenant", "")).first()
        principal = request.GET.get("principal", "")
        if tenant is None or not principal:
            raise Http404("No such principal among your tenants.")
        access = setup.access_of(tenant, principal)
        return self._render(request, "principal.html", f"What {principal} may use", access=access)

    def simulate_view(self, request: HttpRequest) -> HttpResponse:
        """The dry run as a form: nothing runs, nothing is held or recorded."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = SimulationForm(request.user, request.POST or None, initial=request.GET.dict())  # type: ignore[arg-type]
        simulation = None
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                caller = on_behalf(request.user, data["tenant"].slug, data["principal"])  # type: ignore[arg-type]
            except UnknownPrincipal as exc:
                form.add_error("principal", str(exc))
            else:
                connection = data["connection"]
                simulation = runner.simulate(
                    caller,
                    InvocationRequest(
                        tool_id=data["tool_id"],
                        arguments=data["args"],
                        run_id=data["run_id"] or None,
                        connection_id=str(connection.pk) if connection else None,
                    ),
                )
        return self._render(
            request, "simulate.html", "Dry run: what would this call do?", form=form,
            simulation=simulation,
        )  # fmt: skip

    def _render(self, request: HttpRequest, template: str, title: str, **extra: Any) -> Any:
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": title}
        return TemplateResponse(request, f"admin/policies/policy/{template}", context | extra)

    def _principals_by_tenant(self, request: HttpRequest) -> list[tuple[Any, list[str]]]:
        tenants = staff_tenants(request.user, "policies.view_policy")
        return [(t, setup.known_principals(t)) for t in tenants]
