from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.retention.models import PruneMark, RetentionPolicy


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin[RetentionPolicy]):
    """Superusers only: shortening a tenant's audit trail is not a tenant operator's call."""

    list_display = ("tenant", "days", "updated_at")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(PruneMark)
class PruneMarkAdmin(admin.ModelAdmin[PruneMark]):
    """What pruning removed, per pass and tenant (read-only)."""

    list_display = ("tenant", "before", "pruned_at", "records", "events", "approvals")
    list_filter = ("tenant",)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
