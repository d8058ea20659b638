from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import ActionLocation
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.invocations import ledger
from apps.policies.models import Policy
from apps.tenants.admin import TenantScopedGuardedAdmin
from apps.tenants.roles import tenants_where
from apps.tenants.scoping import is_superuser, staff_tenants
from apps.tools import call_settings
from apps.tools.contracts import Idempotency, Retries
from apps.tools.models import Source, Tool

# Who forgets a tenant's idempotency keys: as in the records admin and the API, whoever
# manages its API keys (tenant admins; superusers everywhere).
FORGET_KEYS = "tenants.change_apikey"

CALL_SETTINGS = (
    "idempotency_strategy",
    "idempotency_params",
    "idempotency_scope",
    "idempotency_ttl_s",
    "retry_attempts",
    "retry_backoff_ms",
    "retry_jitter",
)


class ToolForm(forms.ModelForm):
    """The call settings are checked as a contract's are at registration
    (apps/tools/call_settings.py): a strategy params naming an argument the tool does not
    take, or none on an external side effect, is refused here too."""

    class Meta:
        model = Tool
        fields = (
            "enabled",
            "cache_ttl_s",
            "cache_scope",
            "max_concurrency",
            *CALL_SETTINGS,
            "call_settings_by_staff",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tool = self.instance
        if not any(name in data for name in CALL_SETTINGS):
            return data  # shown read-only: nothing to check
        value = {name: data.get(name, getattr(tool, name)) for name in CALL_SETTINGS}
        params = value["idempotency_params"] or []
        if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
            self.add_error("idempotency_params", 'A list of argument names, e.g. ["order_id"].')
            return data
        try:
            call_settings.check(
                tool.effect,
                tool.input_schema,
                Idempotency(
                    strategy=value["idempotency_strategy"],
                    params=tuple(params),
                    scope=value["idempotency_scope"],
                    ttl_s=value["idempotency_ttl_s"] or 0,
                ),
                Retries(
                    attempts=value["retry_attempts"] or 0,
                    backoff_ms=value["retry_backoff_ms"] or 0,
                    jitter=value["retry_jitter"] or 0.0,
                ),
            )
        except call_settings.CallSettingsError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Tool)
class ToolAdmin(TenantScopedGuardedAdmin):
    """The catalog is global: everyone sees every tool, only superusers change or remove one.

    `enabled` switches a tool for every tenant: superusers switch it on the tool's page or
    with the "Enable/Disable selected tools" actions, tenant staff see it read-only (the
    list has no editable column: a hundred forms were most of a page's cost, issue 45);
    what they manage here is their own users' and groups' permissions on a tool (execute_tool,
    decide_approval), which the guardian pages limit to their tenants.
    """

    # `enabled` right after the id: at 1280 px the last columns are off screen.
    lean_list = True  # its columns read no JSON
    list_display = (
        "id",
        "enabled",
        "effect",
        "consequence_level",
        "requires_confirmation",
        "source",
        "available",
    )
    form = ToolForm
    actions = ("enable_tools", "disable_tools", "forget_remembered_keys")
    # Extends guardian's change form with the "used by these policies" list.
    change_form_template = "admin/tools/tool/change_form.html"  # type: ignore[misc]
    list_filter = ("enabled", "effect", "consequence_level", "source", "available")
    search_fields = ("id", "description")
    readonly_fields = (
        "id", "name", "description", "input_schema", "output_schema", "schema_hash", "effect",
        "consequence_level", "requires_confirmation", "requires_connection", "timeout_ms",
        "redaction_result", "redaction_args", "tags", "depends_on", "version", "source",
        "available", "created_at", "updated_at",
    )  # fmt: skip

    # All hold for every tenant.
    superuser_only_fields = (
        "enabled",
        "cache_ttl_s",
        "cache_scope",
        "max_concurrency",
        *CALL_SETTINGS,
        "call_settings_by_staff",
    )

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        return True

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools come from code or MCP discovery, not from a form

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Tools defined in code come back on the next sync: they are disabled, not deleted."""
        if obj is not None and obj.source == Source.CORE:
            return False
        return is_superuser(request.user) and super().has_delete_permission(request, obj)

    def get_actions(
        self, request: HttpRequest, action_location: ActionLocation = ActionLocation.CHANGE_LIST
    ) -> Any:
        actions = super().get_actions(request, action_location)
        actions.pop("delete_selected", None)  # it would delete code-defined tools too
        if not is_superuser(request.user):  # `enabled` is global
            actions.pop("enable_tools", None)
            actions.pop("disable_tools", None)
        if not tenants_where(request.user, FORGET_KEYS).exists():
            actions.pop("forget_remembered_keys", None)
        return actions

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        """Settings staff change are kept by the next sync (Tool.apply_call_settings)."""
        if set(form.changed_data) & set(CALL_SETTINGS):
            obj.call_settings_by_staff = True
        super().save_model(request, obj, form, change)

    @admin.action(description="Enable selected tools (for every tenant)")
    def enable_tools(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        self._switch(request, queryset, enabled=True)

    @admin.action(description="Disable selected tools (for every tenant)")
    def disable_tools(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        self._switch(request, queryset, enabled=False)

    def _switch(self, request: HttpRequest, queryset: QuerySet[Tool], *, enabled: bool) -> None:
        if not is_superuser(request.user):  # a forged action POST: the list offers none
            raise PermissionDenied("Only superusers switch tools, for every tenant at once.")
        changed = queryset.exclude(enabled=enabled).update(enabled=enabled)
        state = "enabled" if enabled else "disabled"
        self.message_user(request, f"{changed} tool(s) {state}.", messages.SUCCESS)

    @admin.action(description="Forget the remembered idempotency keys of the selected tools")
    def forget_remembered_keys(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        """The tools' next calls run again instead of replaying a remembered success
        (apps/invocations/ledger.py): in every tenant for a superuser, in the tenants a
        tenant admin administers otherwise. A call still running keeps its key until it
        ends."""
        tenants = list(tenants_where(request.user, FORGET_KEYS))
        if not tenants:  # a forged action POST: the list offers none
            raise PermissionDenied("Only a tenant's admins forget its idempotency keys.")
        tool_ids = list(queryset.values_list("pk", flat=True))
        forgotten = ledger.invalidate_tools(tenants, tool_ids)
        where = "every tenant" if is_superuser(request.user) else _names(tenants)
        self.message_user(
            request,
            f"{forgotten} idempotency key(s) of {len(tool_ids)} tool(s) forgotten in {where}.",
            messages.SUCCESS,
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        tool = self.get_object(request, object_id)
        context = {**(extra_context or {})}
        if tool is not None:
            # Only tenants where the role shows policies (not where it only decides).
            tenants = staff_tenants(request.user, "policies.view_policy")
            context["used_by_policies"] = policies_using(tool, tenants)
        return super().change_view(request, object_id, form_url, context)


def _names(tenants: list[Any]) -> str:
    return ", ".join(sorted(tenant.slug for tenant in tenants))


def policies_using(tool: Tool, tenants: Any) -> list[Policy]:
    """Policies of these tenants that list the tool, by id or by pattern."""
    policies = Policy.objects.filter(tenant__in=tenants).select_related("tenant")
    return [
        policy
        for policy in policies.prefetch_related("tools")
        if policy.lists(tool, {t.pk for t in policy.tools.all()})
    ]
