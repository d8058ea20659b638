from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def sign_in(request: HttpRequest) -> dict[str, Any]:
    """What the login page offers: the provider's button, the password form, or both."""
    return {
        "oidc_enabled": bool(settings.TOOLHUB_OIDC_ISSUER),
        "oidc_name": settings.TOOLHUB_OIDC_NAME,
        "password_login": settings.TOOLHUB_PASSWORD_LOGIN,
    }
