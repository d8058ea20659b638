from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from apps.connections.models import SECRET_FIELDS, Connection, Grant
from apps.tenants.admin import TenantScopedAdmin, TenantScopedGuardedAdmin

SECRET_INPUTS = sorted({name for names in SECRET_FIELDS.values() for name in names})


class ConnectionForm(forms.ModelForm[Connection]):
    """Secrets are write-only: the form never shows a stored value back."""

    header_name = forms.CharField(
        required=False, help_text="API key: the header to send, e.g. X-Api-Key"
    )
    value = forms.CharField(required=False, widget=forms.PasswordInput, help_text="API key value")
    token = forms.CharField(required=False, widget=forms.PasswordInput, help_text="Bearer token")
    username = forms.CharField(required=False, help_text="Basic auth user name")
    password = forms.CharField(
        required=False, widget=forms.PasswordInput, help_text="Basic auth password"
    )
    access_token = forms.CharField(
        required=False, widget=forms.PasswordInput, help_text="OAuth access token"
    )
    refresh_token = forms.CharField(
        required=False, widget=forms.PasswordInput, help_text="OAuth refresh token"
    )

    class Meta:
        model = Connection
        fields = ["tenant", "name", "kind", "allowed_hosts", "allow_private_network"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        given = {name: data.get(name) or "" for name in SECRET_INPUTS}
        if any(given.values()) or not self.instance.has_secret:
            kind = data.get("kind")
            if kind:
                self.instance.kind = kind
                try:
                    self.instance.set_secret(**given)
                except forms.ValidationError as exc:
                    raise forms.ValidationError(exc.messages) from None
        return data


@admin.register(Connection)
class ConnectionAdmin(TenantScopedGuardedAdmin):
    form = ConnectionForm
    list_display = ("name", "tenant", "kind", "allowed_hosts", "allow_private_network", "id")
    list_filter = ("tenant", "kind")
    search_fields = ("name",)
    readonly_fields = ("id", "secret_status", "created_at", "updated_at")

    @admin.display(description="secret")
    def secret_status(self, obj: Connection) -> str:
        return "stored (encrypted; never shown)" if obj.has_secret else "none"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            "tenant",
            "name",
            "kind",
            "allowed_hosts",
            "allow_private_network",
            *SECRET_INPUTS,
            "id",
            "secret_status",
        ]


@admin.register(Grant)
class GrantAdmin(TenantScopedAdmin):
    list_display = (
        "connection",
        "principal",
        "run_id",
        "tenant",
        "expires_at",
        "revoked_at",
        "created_at",
    )
    list_filter = ("tenant", "revoked_at")
    search_fields = ("principal", "run_id", "connection__name")
    actions = ("revoke",)

    @admin.action(description="Revoke selected grants")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for grant in queryset.filter(revoked_at__isnull=True):
            grant.revoke()
