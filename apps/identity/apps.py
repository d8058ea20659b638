from django.apps import AppConfig


class IdentityConfig(AppConfig):
    """Staff sign-in with an OpenID provider: the group -> (tenant, role) mapping and the
    sign-in that keeps memberships in step with the provider's groups."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "apps.identity"
    verbose_name = "Identity (staff sign-in)"
