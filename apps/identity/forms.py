from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError


class LoginForm(AdminAuthenticationForm):
    """The admin's password login; with TOOLHUB_PASSWORD_LOGIN=0 only superusers pass it
    (the way in when the provider is down), and only after the right password, so the
    answer tells nobody who is a superuser. django-axes counts its failures as before."""

    def confirm_login_allowed(self, user: Any) -> None:
        if not settings.TOOLHUB_PASSWORD_LOGIN and not user.is_superuser:
            raise ValidationError(
                f"Password sign-in is switched off here: sign in with "
                f"{settings.TOOLHUB_OIDC_NAME}.",
                code="password_login_off",
            )
        super().confirm_login_allowed(user)
