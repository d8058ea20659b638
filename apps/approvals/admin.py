from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import JSONField, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, ApprovalWebhook, Vote, WebhookDelivery
from apps.invocations import links
from apps.tenants.admin import ScopedChoicesMixin, TenantScopedAdmin


def _pretty(value: Any) -> str:
    return format_html(
        '<pre class="toolhub-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False)
    )


class VoteInline(ScopedChoicesMixin, admin.TabularInline[Vote, ApprovalRequest]):
    model = Vote
    extra = 0
    can_delete = False
    readonly_fields = ("user", "decision", "reason", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(TenantScopedAdmin):
    """Listed here too; the approve and reject actions go through the same decision code."""

    lean_list = True  # its columns read no JSON
    list_display = (
        "created_at",
        "tool",
        "principal",
        "tenant",
        "status",
        "expires_at",
        "decided_by",
    )
    # No "tool" filter: it lists every tool (10,000 in a large catalog) on every page.
    list_filter = ("status", "tenant")
    search_fields = (
        "=id",
        "=invocation__id",
        "=run_id",
        "=tool_call_id",
    )
    exact_search_only = True
    search_help_text = "An approval, invocation, run or tool call id (whole ids only)."
    # Shown pretty-printed (the *_json fields below), never as editable text.
    exclude = ("args", "original_args", "args_diff")
    readonly_fields = [
        *(f.name for f in ApprovalRequest._meta.fields if not isinstance(f, JSONField)),
        "related",
        "args_json",
        "original_args_json",
        "args_diff_json",
    ]

    @admin.display(description="Links")
    def related(self, approval: ApprovalRequest) -> str:
        items = [
            links.Link("console", reverse("console:detail", args=[approval.pk])),
            links.Link(
                "invocation record",
                reverse("admin:invocations_invocationrecord_change", args=[approval.invocation_id]),
            ),
            links.Link(
                "run timeline", links.run_timeline_url(approval.run_id, approval.tenant.slug)
            ),
            *links.policy_links(approval.policy_rule),
        ]
        connection = links.connection_link(approval.connection_id)
        if connection is not None:
            items.append(connection)
        return format_html_join(" · ", '<a href="{}">{}</a>', ((i.url, i.text) for i in items))

    @admin.display(description="Arguments that run")
    def args_json(self, approval: ApprovalRequest) -> str:
        return _pretty(approval.args)

    @admin.display(description="Arguments as requested")
    def original_args_json(self, approval: ApprovalRequest) -> str:
        return _pretty(approval.original_args)

    @admin.display(description="Edits")
    def args_diff_json(self, approval: ApprovalRequest) -> str:
        return _pretty(approval.args_diff)

    inlines = [VoteInline]
    actions = ("approve_selected", "reject_selected")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Approve selected calls (as they are)")
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> None:
        self._decide(request, queryset, "approve")

    @admin.action(description="Reject selected calls")
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> None:
        self._decide(request, queryset, "reject")

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest], decision: str
    ) -> None:
        assert isinstance(request.user, User)
        done, refused = 0, []
        for approval_id in queryset.values_list("pk", flat=True):
            try:
                decisions.decide(approval_id, request.user, decision, "Decided in the admin.")
                done += 1
            except decisions.DecisionError as exc:
                refused.append(f"{approval_id}: {exc}")
        if done:
            messages.success(request, f"{done} request(s) {decision}d.")
        for line in refused:
            messages.error(request, line)


class ApprovalWebhookForm(forms.ModelForm[ApprovalWebhook]):
    """A tenant's staff may point a webhook anywhere public; a superuser decides whether it
    may reach the host's private networks, for the URL it had then (a tenant admin who
    changes that URL needs a superuser again). Rules must be the webhook's tenant's."""

    # Set by TenantScopedAdmin.get_form: only a superuser may change egress.
    edited_by_superuser = False

    signing_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput,
        help_text="Signs every message (X-Toolhub-Signature); write-only, blank keeps it.",
    )

    class Meta:
        model = ApprovalWebhook
        fields = ["tenant", "name", "format", "url", "rules", "enabled", "private_network"]

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"]
        opened = self.instance.pk is not None and self.instance.private_network
        if opened and not self.edited_by_superuser and url != self.instance.url:
            raise forms.ValidationError(
                "This webhook may reach private and loopback addresses, which a superuser "
                "allowed for its current URL: only a superuser may change it."
            )
        return url

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tenant = data.get("tenant") or (self.instance.tenant if self.instance.pk else None)
        foreign = [
            rule
            for rule in data.get("rules") or []
            if rule.policy.tenant_id != getattr(tenant, "pk", None)
        ]
        if tenant is not None and foreign:
            self.add_error(
                "rules",
                "Rules of another tenant's policies cannot trigger this webhook: "
                + ", ".join(str(rule.pk) for rule in foreign),
            )
        return data

    def save(self, commit: bool = True) -> ApprovalWebhook:
        if self.cleaned_data.get("signing_secret"):
            self.instance.set_secret(self.cleaned_data["signing_secret"])
        return super().save(commit)


class DeliveryInline(admin.TabularInline[WebhookDelivery, ApprovalWebhook]):
    model = WebhookDelivery
    fk_name = "webhook"
    extra = 0
    max_num = 0
    can_delete = False
    fields = ("created_at", "approval", "status", "attempts", "last_status", "last_error")
    readonly_fields = fields
    ordering = ("-created_at",)
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDelivery]:
        # The newest few: a busy webhook has a delivery per held call.
        pks = super().get_queryset(request).order_by("-created_at").values("pk")[:20]
        return super().get_queryset(request).filter(pk__in=pks)


@admin.register(ApprovalWebhook)
class ApprovalWebhookAdmin(TenantScopedAdmin):
    """A tenant's chat channels and receivers for held calls; their recent deliveries."""

    form = ApprovalWebhookForm
    list_display = ("name", "tenant", "format", "url", "enabled", "private_network")
    list_filter = ("tenant", "format", "enabled")
    search_fields = ("name",)
    superuser_only_fields = ("private_network",)
    readonly_fields = ("secret_status", "created_at")
    filter_horizontal = ("rules",)
    inlines = [DeliveryInline]

    @admin.display(description="signing secret")
    def secret_status(self, obj: ApprovalWebhook) -> str:
        return "stored (encrypted; never shown)" if obj.secret else "none: messages are unsigned"


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(TenantScopedAdmin):
    """Every announcement of a held call to a webhook, and how it went (read-only)."""

    list_display = (
        "created_at",
        "tenant",
        "webhook",
        "approval",
        "status",
        "attempts",
        "last_status",
    )
    list_filter = ("status", "tenant")
    search_fields = ("=approval__id",)
    exact_search_only = True
    search_help_text = "An approval id (whole ids only)."
    list_select_related = ("tenant", "webhook")
    readonly_fields = [field.name for field in WebhookDelivery._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
