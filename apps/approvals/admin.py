from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest, Vote
from apps.tenants.admin import ScopedChoicesMixin, TenantScopedAdmin


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
    list_filter = ("status", "tenant", "tool")
    search_fields = ("principal", "run_id", "tool_call_id", "decision_reason")
    readonly_fields = [f.name for f in ApprovalRequest._meta.fields]
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
