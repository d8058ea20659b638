"""Typed readers for environment variables.

Settings come from the environment only. Each helper refuses values it cannot
interpret instead of guessing, so a typo in a deployment fails at start-up with
the variable's name in the message rather than running with a surprise default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}"
    )


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer; got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}; got {value}")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    items = [item.strip() for item in raw.split(",")]
    if any(item == "" for item in items) and raw.strip() != "":
        raise ImproperlyConfigured(f"{name} is a comma-separated list with an empty item: {raw!r}")
    return [item for item in items if item]


def env_json_list(name: str) -> list[object]:
    """A JSON list (empty when unset); anything else is refused with the variable's name."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON list: {exc}") from None
    if not isinstance(value, list):
        raise ImproperlyConfigured(f"{name} must be a JSON list; got {type(value).__name__}")
    return value


def env_json_object(name: str) -> dict[str, object]:
    """A JSON object (empty when unset); anything else is refused with the variable's name."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object; got {type(value).__name__}")
    return value


# Secret keys that must never protect a real deployment.
INSECURE_SECRET_KEYS = {"", "changeme", "change-me", "secret", "insecure", "django-insecure"}


def env_secret(
    name: str,
    *,
    debug: bool,
    dev_default: str,
    min_length: int = 32,
    fallback_file: Path | None = None,
) -> str:
    """A secret that must be set, long and non-default unless running in debug mode.

    When the variable is unset, `fallback_file` (if it exists) supplies the value: the key
    `scripts/run` generated in the var directory, so `manage.py` in that checkout needs no
    environment. The same checks apply to it.
    """
    value = os.environ.get(name, "").strip() or read_secret_file(fallback_file)
    if debug and not value:
        return dev_default
    if (
        value.lower() in INSECURE_SECRET_KEYS
        or value.startswith("django-insecure")
        or value == dev_default
    ):
        raise ImproperlyConfigured(
            f"{name} is missing or a known default; set it to a random value of "
            f"{min_length}+ characters (or set TOOLHUB_DEBUG=1 for local development)"
        )
    if len(value) < min_length:
        raise ImproperlyConfigured(f"{name} must be at least {min_length} characters long")
    return value


def read_secret_file(path: Path | None) -> str:
    """A secret kept in a file (stripped), or "" when there is no such file."""
    if path is None or not path.is_file():
        return ""
    return path.read_text().strip()
