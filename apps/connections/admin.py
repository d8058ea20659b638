from __future__ import annotations

from django.contrib import admin

from apps.connections.models import Connection


@admin.register(Connection)
class ConnectionAdmin(admin.ModelAdmin[Connection]):
    list_display = ("name", "tenant", "kind", "id", "created_at")
    list_filter = ("tenant", "kind")
    search_fields = ("name",)
