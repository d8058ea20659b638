"""The configured OpenID provider: its settings and its discovery document.

The endpoints come from `{TOOLHUB_OIDC_ISSUER}/.well-known/openid-configuration`, read
at the first sign-in and kept for an hour. A document whose `issuer` is not exactly the
configured one is refused (OpenID Connect Discovery 1.0, 4.3): behind a wrong URL, or a
provider answering for another, toolhub would trust the wrong keys.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from django.conf import settings

DISCOVERY_TTL = 3600.0
_lock = threading.Lock()
_cached: tuple[float, str, dict[str, Any]] | None = None


class ProviderUnavailable(Exception):
    """Sign-in with the provider cannot start; the message says why, for the page."""


def enabled() -> bool:
    return bool(settings.TOOLHUB_OIDC_ISSUER)


def issuer() -> str:
    return str(settings.TOOLHUB_OIDC_ISSUER)


def discovery() -> dict[str, Any]:
    global _cached
    now = time.monotonic()
    with _lock:
        if _cached and _cached[1] == issuer() and now - _cached[0] < DISCOVERY_TTL:
            return _cached[2]
    document = _fetch()
    with _lock:
        _cached = (now, issuer(), document)
    return document


def forget() -> None:
    """Read the document again at the next use (tests; a provider that moved)."""
    global _cached
    with _lock:
        _cached = None


def _fetch() -> dict[str, Any]:
    url = issuer().rstrip("/") + "/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document: dict[str, Any] = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ProviderUnavailable(
            f"The identity provider's discovery document at {url} could not be read: {error}"
        ) from None
    if document.get("issuer") != issuer():
        raise ProviderUnavailable(
            f"The identity provider at {url} says its issuer is {document.get('issuer')!r}, "
            f"not {issuer()!r} (TOOLHUB_OIDC_ISSUER). Sign-in is refused: set "
            "TOOLHUB_OIDC_ISSUER to the issuer exactly as the provider names it."
        )
    for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        if not document.get(name):
            raise ProviderUnavailable(f"The provider's discovery document at {url} has no {name}.")
    return document


def endpoint(name: str) -> str:
    """An endpoint of the discovery document ('' when the provider has none)."""
    return str(discovery().get(name) or "")
