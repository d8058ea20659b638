from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.tenants.admin import TenantScopedGuardedAdmin
from apps.tenants.scoping import is_superuser
from apps.tools.models import Tool


@admin.register(Tool)
class ToolAdmin(TenantScopedGuardedAdmin):
    """The catalog is global: everyone sees every tool, only superusers change or remove one.

    `enabled` switches a tool for every tenant, so tenant staff see it read-only; what they
    manage here is their own users' and groups' permissions on a tool (execute_tool,
    decide_approval), which the guardian pages limit to their tenants.
    """

    list_display = (
        "id",
        "effect",
        "consequence_level",
        "requires_confirmation",
        "source",
        "available",
        "enabled",
    )
    list_editable = ("enabled",)
    list_filter = ("enabled", "effect", "consequence_level", "source", "available")
    search_fields = ("id", "description")
    readonly_fields = (
        "id", "name", "description", "input_schema", "output_schema", "schema_hash", "effect",
        "consequence_level", "requires_confirmation", "requires_connection", "timeout_ms",
        "redaction_result", "redaction_args", "tags", "version", "source", "available",
        "created_at", "updated_at",
    )  # fmt: skip

    superuser_only_fields = ("enabled",)

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        return True

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        if not is_superuser(request.user):
            changelist.list_editable = ()  # `enabled` is global
        return changelist

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools come from code or MCP discovery, not from a form

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_superuser(request.user) and super().has_delete_permission(request, obj)
