from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.admin import TenantScopedAdmin


@admin.register(InvocationRecord)
class InvocationRecordAdmin(TenantScopedAdmin):
    """Records are evidence: readable, never editable."""

    list_display = (
        "created_at",
        "tool_ref",
        "principal",
        "tenant",
        "status",
        "error_code",
        "duration_ms",
    )
    list_filter = ("tenant", "status", "error_code", "tool_ref")
    search_fields = ("tool_call_id", "run_id", "principal", "tool_ref", "safe_message")
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RunEvent)
class RunEventAdmin(TenantScopedAdmin):
    """Events are evidence too: readable, never editable or deletable, even by superusers."""

    list_display = ("at", "run_id", "seq", "type", "tool_id", "tenant")
    list_filter = ("tenant", "type")
    search_fields = ("run_id", "tool_call_id")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
