from django.contrib import admin
from django.http import HttpRequest
from oauth2_provider import models as oauth2_models

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


# django-oauth-toolkit's own admin pages (applications, grants, tokens) are not offered:
# their rows belong to no tenant. A client's tokens act through an API key of their own
# ("OAuth client <name>", among the tenant's API keys): revoking that key refuses them
# and ends their streams.
for _model in (
    oauth2_models.get_application_model(),
    oauth2_models.get_access_token_model(),
    oauth2_models.get_refresh_token_model(),
    oauth2_models.get_grant_model(),
    oauth2_models.get_id_token_model(),
    oauth2_models.get_device_grant_model(),
):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
