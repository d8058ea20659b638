from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from apps.connections.models import SECRET_FIELDS, Connection, Grant, validate_host_pattern
from apps.tenants.admin import TenantScopedAdmin, TenantScopedGuardedAdmin
from toolhub.web import json_input

SECRET_INPUTS = sorted({name for names in SECRET_FIELDS.values() for name in names})


class HostListField(forms.Field):
    """Allowed hosts as a list, one per line, each checked as a host name."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 40})

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[str]:
        text = value.strip() if isinstance(value, str) else ""
        if text.startswith("["):  # a JSON list, as the field took before
            try:
                parsed = json_input.loads(text)
            except json_input.JsonInputError as exc:
                reason = str(exc) if exc.limit else "Not a JSON list."
                raise forms.ValidationError(f"{reason} Write one host per line.") from None
            return parsed if isinstance(parsed, list) else [parsed]
        return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]

    def validate(self, value: Any) -> None:
        if not value:
            raise forms.ValidationError("Name at least one host the credential may be sent to.")
        validate_host_pattern(value)


class ConnectionForm(forms.ModelForm[Connection]):
    """Secrets are write-only: the form never shows a stored value back.

    Only the chosen kind's credential fields count (connection_form.js shows only them);
    a change of kind needs the new kind's credentials.

    Egress to private networks is the host operator's: `allow_private_network` is a
    superuser's field (read-only to tenant staff, ConnectionAdmin), and tenant staff may
    not change the hosts of a connection a superuser let into the private network, or
    they could point that permission anywhere.
    """

    # Set by TenantScopedAdmin.get_form: only a superuser may change egress.
    edited_by_superuser = False

    allowed_hosts = HostListField(
        help_text="One host per line, e.g. api.example.com or *.example.org "
        "(no scheme, path or port). The credential is sent to these hosts only."
    )

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

    class Media:
        js = ("toolhub/connection_form.js",)

    def clean_allowed_hosts(self) -> list[str]:
        hosts: list[str] = self.cleaned_data["allowed_hosts"]
        opened = self.instance.pk is not None and self.instance.allow_private_network
        if opened and not self.edited_by_superuser and hosts != self.initial.get("allowed_hosts"):
            raise forms.ValidationError(
                "This connection may reach private and loopback addresses, which a "
                "superuser allowed for its current hosts: only a superuser may change them."
            )
        return hosts

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if not kind:
            return data
        given = {name: data.get(name) or "" for name in SECRET_FIELDS[kind]}
        kind_changed = self.instance.has_secret and kind != self.instance.kind
        if any(given.values()) or not self.instance.has_secret or kind_changed:
            self.instance.kind = kind
            try:
                self.instance.set_secret(**given)
            except forms.ValidationError as exc:
                raise forms.ValidationError(exc.messages) from None
        return data


@admin.register(Connection)
class ConnectionAdmin(TenantScopedGuardedAdmin):
    form = ConnectionForm
    list_display = ("name", "tenant", "kind", "hosts", "allow_private_network", "id")
    list_filter = ("tenant", "kind")
    search_fields = ("name",)
    readonly_fields = ("id", "secret_status", "created_at", "updated_at")
    superuser_only_fields = ("allow_private_network",)

    @admin.display(description="allowed hosts")
    def hosts(self, obj: Connection) -> str:
        return ", ".join(obj.allowed_hosts)  # not the JSON list

    @admin.display(description="secret")
    def secret_status(self, obj: Connection) -> str:
        return "stored (encrypted; never shown)" if obj.has_secret else "none"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # No id on the add page: the row gets its id when saved, and a readonly field
        # there would show one the save does not use.
        saved = ["id", "secret_status"] if obj is not None else []
        return [
            *saved,
            "tenant",
            "name",
            "kind",
            "allowed_hosts",
            "allow_private_network",
            *SECRET_INPUTS,
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
        # One bulk update: one change of the authorization epoch (GrantQuerySet), not one
        # per grant, and every process's caches refill once.
        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
