"""An external token issuer's signing keys: OpenID Connect discovery, then its JWKS.

The discovery document is read once per process and must name exactly the configured
issuer (OpenID Connect Discovery 4.3; RFC 9207's point: a token is only as good as the
issuer it is checked against). The key set is kept for KEYS_TTL_S; a token naming a key
not in it re-reads the set (the issuer rotated its keys), at most once per
REFRESH_MIN_S, so tokens with made-up key ids cannot turn toolhub into a flood of
requests to the issuer.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from jwt import PyJWK
from jwt.exceptions import InvalidKeyError, PyJWKError

from apps.oauth.resource import Refusal

KEYS_TTL_S = 300.0
REFRESH_MIN_S = 30.0
FETCH_TIMEOUT_S = 5.0
MAX_DOCUMENT_BYTES = 256 * 1024


class IssuerUnavailable(Refusal):
    """The issuer's discovery document or keys could not be read: toolhub's problem to
    report (503), not the token's."""

    def __init__(self, description: str) -> None:
        super().__init__(503, "", description)


def _read_json(url: str) -> dict[str, Any]:
    if not url.startswith(("https://", "http://")):
        raise IssuerUnavailable(f"The token issuer's URL {url!r} is not http(s).")
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
            body = response.read(MAX_DOCUMENT_BYTES + 1)
        if len(body) > MAX_DOCUMENT_BYTES:
            raise ValueError("document too large")
        document = json.loads(body)
    except (OSError, ValueError) as exc:
        raise IssuerUnavailable(f"Could not read {url} ({exc}); try again later.") from None
    if not isinstance(document, dict):
        raise IssuerUnavailable(f"{url} is not a JSON object.")
    return document


@dataclass(frozen=True)
class SigningKey:
    kid: str
    kty: str
    alg: str | None  # the algorithm the JWK is limited to, if it names one
    key: Any  # the public key, as the cryptography library holds it


class Issuer:
    """One configured issuer's discovery document and key set, shared by the process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._jwks_uri: str | None = None
        self._keys: dict[str, SigningKey] = {}
        self._read_at = 0.0

    def signing_key(self, kid: str) -> SigningKey:
        with self._lock:
            now = time.monotonic()
            stale = self._jwks_uri is None or now - self._read_at > KEYS_TTL_S
            rotated = kid not in self._keys and now - self._read_at > REFRESH_MIN_S
            if stale or rotated:
                self._refresh(now)
            key = self._keys.get(kid)
        if key is None:
            raise Refusal(
                401, "invalid_token", f"The token's signing key {kid!r} is not one of the issuer's."
            )
        return key

    def _refresh(self, now: float) -> None:
        if self._jwks_uri is None:
            document = _read_json(self.url.rstrip("/") + "/.well-known/openid-configuration")
            if document.get("issuer") != self.url:
                raise IssuerUnavailable(
                    f"The discovery document of {self.url} names another issuer "
                    f"({document.get('issuer')!r})."
                )
            jwks_uri = document.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise IssuerUnavailable(f"The discovery document of {self.url} has no jwks_uri.")
            self._jwks_uri = jwks_uri
        listed = _read_json(self._jwks_uri).get("keys")
        if not isinstance(listed, list):
            raise IssuerUnavailable(f"{self._jwks_uri} is not a JWK set (no keys).")
        keys: dict[str, SigningKey] = {}
        for data in listed:
            # Signing keys with an id only: a key without one cannot be chosen safely.
            if not isinstance(data, dict) or data.get("use", "sig") != "sig":
                continue
            if not isinstance(data.get("kid"), str):
                continue
            try:
                public = PyJWK(data).key
                alg = data.get("alg") if isinstance(data.get("alg"), str) else None
                keys[data["kid"]] = SigningKey(data["kid"], str(data.get("kty")), alg, public)
            except (PyJWKError, InvalidKeyError):
                continue  # a key type this library does not know: skipped, as RFC 7517 5 says
        self._keys = keys
        self._read_at = now


_issuers: dict[str, Issuer] = {}
_issuers_lock = threading.Lock()


def issuer(url: str) -> Issuer:
    with _issuers_lock:
        found = _issuers.get(url)
        if found is None:
            found = _issuers[url] = Issuer(url)
        return found


def forget_all() -> None:
    """Drop every cached document and key set (tests that start their own issuer)."""
    with _issuers_lock:
        _issuers.clear()
