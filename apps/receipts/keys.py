"""Receipt signing keys: made, kept, chosen, rotated and published.

Ed25519 (JWS `alg` "Ed25519", RFC 9864's name for EdDSA over Ed25519). The private key
is encrypted with TOOLHUB_ENCRYPTION_KEY (apps.connections.crypto), as connection
secrets are, so a copy of the database alone signs nothing. Only the key that signs now
is ever decrypted: after a change of TOOLHUB_ENCRYPTION_KEY, `rotate_receipt_key` makes
one encrypted with the newest key (a signing key no configured key decrypts is rotated
out by the first call that needs it).

Which key signs is cached per process under the authorization epoch: a call reads the
epoch for its checks anyway (apps.tenants.epoch), and `signer()` is asked inside those
checks, so choosing the key costs no query of its own. `rotate()` bumps the epoch, so
every process takes the new key at its next call. A call already past its checks signs
its receipt with the key it was checked with; so a rotated-out key keeps verifying for
receipts signed until `retires_at`, which `rotate()` sets a margin past the longest
call a tool allows. From then on it signs nothing: a receipt it signed later is refused
(verification.py), and no process of ours makes one.
"""

from __future__ import annotations

import base64
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from joserfc import jws
from joserfc.jwk import OKPKey

from apps.connections import crypto
from apps.receipts.models import SigningKey
from apps.tenants import epoch

logger = logging.getLogger(__name__)

ALG = "Ed25519"
TYP = "toolhub-receipt"
# How long past the longest tool timeout a rotated-out key may still be signing with
# (a call checked just before the rotation, then run to its timeout, then recorded).
ROTATION_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True)
class Signer:
    kid: str
    key: OKPKey

    def sign(self, payload: bytes) -> str:
        """A compact JWS of `payload`, naming this key (`kid`)."""
        header = {"alg": ALG, "kid": self.kid, "typ": TYP}
        return jws.serialize_compact(header, payload, self.key, algorithms=[ALG])


_lock = threading.Lock()
_cached: tuple[int, Signer] | None = None


def signer() -> Signer:
    """The key that signs now: the newest not rotated out, made on first use."""
    global _cached
    at = epoch.current()
    with _lock:
        cached = _cached
    if cached is not None and cached[0] == at:
        return cached[1]
    row = SigningKey.objects.active().first()
    if row is None:
        # Not cached: if the caller's transaction rolls back, this key is gone, and the
        # next call makes or finds another.
        return _signer_of(create())
    try:
        found = _signer_of(row)
    except crypto.SecretUnreadable:
        # TOOLHUB_ENCRYPTION_KEY no longer holds the key it was encrypted with: calls go
        # on, signed by a new key; the unreadable one retires (its public half stays).
        logger.warning("receipt key %s is unreadable with the configured keys: rotating", row.kid)
        return _signer_of(rotate()[0])
    with _lock:
        _cached = (at, found)
    return found


def forget() -> None:
    """Drop the cached signer (tests that replace keys under one epoch)."""
    global _cached
    with _lock:
        _cached = None


def _signer_of(row: SigningKey) -> Signer:
    secret = crypto.decrypt(row.private_key_encrypted)
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": row.public_x, "d": secret["d"], "kid": row.kid}
    return Signer(row.kid, OKPKey.import_key(jwk))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def create(using: str = "default") -> SigningKey:
    """A new key pair, stored; its `kid` is its RFC 7638 JWK thumbprint."""
    private = Ed25519PrivateKey.generate()
    d = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    x = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    public = OKPKey.import_key({"kty": "OKP", "crv": "Ed25519", "x": _b64(x)})
    return SigningKey.objects.using(using).create(
        kid=public.thumbprint(),
        public_x=_b64(x),
        private_key_encrypted=crypto.encrypt({"d": _b64(d)}),
        created_at=timezone.now(),
    )


def rotation_overlap() -> timedelta:
    """How long a rotated-out key may still be signing: the longest tool timeout, plus a
    margin (see the module docstring)."""
    from apps.tools.models import Tool

    longest = Tool.objects.aggregate(longest=Max("timeout_ms"))["longest"] or 0
    return timedelta(milliseconds=longest) + ROTATION_MARGIN


def rotate() -> tuple[SigningKey, list[SigningKey]]:
    """A new key signs from the next call on; the old ones retire after the overlap and
    stay published. Answers the new key and the keys rotated out."""
    with transaction.atomic():
        retiring = list(SigningKey.objects.select_for_update().filter(retires_at__isnull=True))
        new = create()
        retires_at = timezone.now() + rotation_overlap()
        for key in retiring:
            key.retires_at = retires_at
            key.save(update_fields=["retires_at"])
        epoch.bump()  # every process chooses its signer again at its next call
    forget()
    return new, retiring


def public_jwk(key: SigningKey) -> dict[str, Any]:
    """The key as the JWKS publishes it; a rotated-out key says until when it signed."""
    jwk: dict[str, Any] = {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": key.public_x,
        "kid": key.kid,
        "alg": ALG,
        "use": "sig",
    }
    if key.retires_at is not None:
        jwk["toolhub_retires_at"] = instant(key.retires_at)
    return jwk


def jwks() -> dict[str, Any]:
    """Every key that ever signed, newest first: receipts outlive the key that signed them."""
    return {"keys": [public_jwk(key) for key in SigningKey.objects.order_by("-created_at")]}


def instant(value: datetime) -> str:
    """UTC, microseconds, Z: one fixed width, so two instants compare as strings too."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
