from django.contrib import admin
from django.http import HttpRequest

from apps.oauth.models import TokenKey


@admin.register(TokenKey)
class TokenKeyAdmin(admin.ModelAdmin):
    """Which key each issuer's principal acts through; made by tokens, never by hand.
    Revoke the key (API keys) to refuse that principal's tokens."""

    list_display = ("principal", "tenant", "issuer", "key", "created_at")
    list_filter = ("tenant",)
    readonly_fields = ("issuer", "tenant", "principal", "key", "created_at")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Superusers only, whatever global permissions a staff member holds: deleting the
        # row would let the next token make a fresh key past a revoked one.
        return bool(request.user.is_superuser)
