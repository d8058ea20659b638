from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import JSONField, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, Vote
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
