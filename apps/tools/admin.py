from __future__ import annotations

from django.contrib import admin
from guardian.admin import GuardedModelAdmin

from apps.tools.models import Tool


@admin.register(Tool)
class ToolAdmin(GuardedModelAdmin):
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

    def has_add_permission(self, request: object) -> bool:
        return False  # tools come from code or MCP discovery, not from a form
