from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.tenants.models import ApiKey, Tenant


class TenantScopedAdmin(admin.ModelAdmin[Any]):
    """Staff see only the rows of tenants they are members of (superusers see all)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        user = request.user
        if getattr(user, "is_superuser", False):
            return queryset
        return queryset.filter(tenant__in=Tenant.objects.filter(members=user.pk))


class TenantForm(forms.ModelForm[Tenant]):
    webhook_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput,
        help_text="Signing secret for the approval webhook (write-only; blank keeps it).",
    )

    class Meta:
        model = Tenant
        fields = ["slug", "name", "members", "approval_webhook_url"]

    def save(self, commit: bool = True) -> Tenant:
        if self.cleaned_data.get("webhook_secret"):
            self.instance.set_webhook_secret(self.cleaned_data["webhook_secret"])
        return super().save(commit)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin[Tenant]):
    form = TenantForm
    list_display = ("slug", "name", "approval_webhook_url", "created_at")
    search_fields = ("slug", "name")
    filter_horizontal = ("members",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = (
        "display_prefix",
        "principal",
        "tenant",
        "name",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("tenant", "revoked_at")
    search_fields = ("principal", "name", "prefix")
    readonly_fields = ("display_prefix", "created_at", "last_used_at")
    actions = ("revoke_keys",)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        raw = None
        if not change:
            obj.bind_service_user()
            raw = obj.assign_new_secret()
        super().save_model(request, obj, form, change)
        if raw:
            messages.warning(request, f"New API key (copy it now, it is not shown again): {raw}")

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset.filter(revoked_at__isnull=True):
            key.revoke()
