from __future__ import annotations

from django.contrib import admin

from apps.policies.models import Policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin[Policy]):
    list_display = ("name", "tenant", "enabled", "updated_at")
    list_filter = ("tenant", "enabled")
    search_fields = ("name", "description")
    filter_horizontal = ("tools",)
