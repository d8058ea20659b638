from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.identity.models import ExternalIdentity, GroupMapping


class SuperusersOnly:
    """Who gets which role where is a superuser's call, never a tenant admin's."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest, *args: object) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(GroupMapping)
class GroupMappingAdmin(SuperusersOnly, admin.ModelAdmin[GroupMapping]):
    """The provider's groups -> a role in a tenant, applied at each staff sign-in."""

    list_display = ("group", "tenant", "role", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("group",)
    autocomplete_fields = ("tenant",)


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(SuperusersOnly, admin.ModelAdmin[ExternalIdentity]):
    """Which provider account each user is, and their groups at the last sign-in
    (read-only: written by the sign-in)."""

    list_display = ("user", "subject", "issuer", "signed_in_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "groups", "signed_in_at")

    def has_add_permission(self, request: HttpRequest, *args: object) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
