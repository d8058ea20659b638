"""Receipts that must not verify, each refused with a reason, by both verifiers: the
Python client's (toolhub_client.verify_receipt) and the server's (the console's)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone
from toolhub_client import ReceiptError, verify_receipt

from apps.receipts import keys
from apps.receipts.body import canonical
from apps.receipts.models import SigningKey
from apps.receipts.verification import ReceiptInvalid, verify
from tests.conftest import Agent
from tests.receipts.support import b64, parts, published_keys, with_body, with_header

pytestmark = [pytest.mark.django_db, pytest.mark.one_leg]

Verifier = Callable[[str, dict[str, Any]], dict[str, Any]]
VERIFIERS = [
    pytest.param((verify_receipt, ReceiptError), id="client"),
    pytest.param((verify, ReceiptInvalid), id="server"),
]


@pytest.fixture(params=VERIFIERS)
def verifier(request: pytest.FixtureRequest) -> tuple[Verifier, type[Exception]]:
    return request.param


@pytest.fixture
def receipt(agent: Agent) -> str:
    record = agent.invoke("core__get_current_time").json()
    assert record["ok"] is True, record
    return str(record["receipt"])


def refused(verifier: tuple[Verifier, type[Exception]], receipt: str, why: str) -> None:
    check, error = verifier
    with pytest.raises(error, match=why):
        check(receipt, published_keys())


def test_the_untouched_receipt_verifies(verifier, receipt):
    check, _ = verifier
    assert check(receipt, published_keys())["outcome"]["ok"] is True


def test_a_changed_argument_digest_breaks_the_signature(verifier, receipt):
    _, body, _ = parts(receipt)
    body["args"]["sha256"] = hashlib.sha256(b'{"other":"args"}').hexdigest()
    refused(verifier, with_body(receipt, body), "signature does not verify")


def test_a_changed_outcome_breaks_the_signature(verifier, receipt):
    _, body, _ = parts(receipt)
    body["outcome"] = {"status": "failed", "ok": False, "errorCode": "execution"}
    refused(verifier, with_body(receipt, body), "signature does not verify")


def test_an_unknown_kid_is_refused(verifier, receipt):
    header, _, _ = parts(receipt)
    refused(verifier, with_header(receipt, {**header, "kid": "not-a-published-key"}), "kid")


def test_alg_none_is_refused(verifier, receipt):
    header, _, _ = parts(receipt)
    refused(verifier, with_header(receipt, {**header, "alg": "none"}, signature=""), "alg")


def test_hs256_keyed_with_the_public_key_is_refused(verifier, receipt):
    header, _, _ = parts(receipt)
    forged_header = {**header, "alg": "HS256"}
    jwk = next(k for k in published_keys()["keys"] if k["kid"] == header["kid"])
    _, body_part, _ = receipt.split(".")
    head_part = with_header(receipt, forged_header).split(".")[0]
    signing_input = f"{head_part}.{body_part}".encode()
    for secret in (jwk["x"].encode(), canonical(jwk)):
        mac = hmac.new(secret, signing_input, hashlib.sha256).digest()
        refused(verifier, f"{head_part}.{body_part}.{b64(mac)}", "alg 'HS256'")


def test_alg_eddsa_is_refused_too_one_algorithm_no_negotiation(verifier, receipt):
    header, _, _ = parts(receipt)
    refused(verifier, with_header(receipt, {**header, "alg": "EdDSA"}), "alg 'EdDSA'")


def test_garbage_is_refused(verifier):
    refused(verifier, "not.a-receipt", "compact JWS")


def test_a_retired_keys_signature_made_after_it_retired_is_refused(verifier, receipt):
    """A rotated-out key's receipts verify only if signed before it retired: one signed
    with it later (a stolen old key, a clock set back) is refused."""
    header, body, _ = parts(receipt)
    keys.rotate()
    old = SigningKey.objects.get(kid=header["kid"])
    assert old.retires_at is not None
    old.retires_at = timezone.now()
    old.save(update_fields=["retires_at"])
    late = {**body, "signedAt": keys.instant(timezone.now())}
    forged = keys._signer_of(old).sign(canonical(late))
    refused(verifier, forged, "after its key")
    check, _ = verifier
    assert check(receipt, published_keys())["invocationId"] == body["invocationId"]
