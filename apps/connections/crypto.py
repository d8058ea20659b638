"""Encryption at rest for connection secrets (MultiFernet, so keys can rotate).

TOOLHUB_ENCRYPTION_KEY holds one or more comma-separated Fernet keys; the first
encrypts, all decrypt. To rotate: put a new key first, keep the old ones after
it, run `manage.py rotate_connection_keys`, then drop the old keys.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class SecretUnreadable(Exception):
    """A stored secret could not be decrypted with any configured key."""


@cache
def _fernet() -> MultiFernet:
    keys = settings.TOOLHUB_ENCRYPTION_KEYS
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except (ValueError, TypeError):
        raise ImproperlyConfigured(
            "TOOLHUB_ENCRYPTION_KEY must be comma-separated Fernet keys "
            "(32 url-safe base64-encoded bytes each), e.g. from "
            "cryptography.fernet.Fernet.generate_key()"
        ) from None


def check_keys() -> None:
    _fernet()


def keyring() -> object:
    """The configured keys, as one object that is replaced when the keys change: a cache
    of decrypted secrets keyed on it (the broker's) cannot outlive a dropped key."""
    return _fernet()


def encrypt(secret: dict[str, Any]) -> str:
    return _fernet().encrypt(json.dumps(secret).encode()).decode()


def decrypt(token: str) -> dict[str, Any]:
    try:
        value: dict[str, Any] = json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        raise SecretUnreadable("no configured key decrypts this secret") from None
    return value


def rotate(token: str) -> str:
    """Re-encrypt with the first (newest) key."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("no configured key decrypts this secret") from None
