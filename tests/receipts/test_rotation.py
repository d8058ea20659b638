"""Rotating the signing key: `manage.py rotate_receipt_key` makes a new key that signs
from the next call on; the old one stays published, retires after the longest tool
timeout, and its receipts keep verifying. A call running across a rotation ends as
usual, its receipt signed by the key it was checked with."""

from __future__ import annotations

import threading
from datetime import datetime
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import override_settings
from toolhub_client import verify_receipt

from apps.connections import crypto
from apps.receipts import keys
from apps.receipts.models import SigningKey
from apps.tools.models import Tool
from tests.conftest import Agent, allow
from tests.receipts.support import parts, published_keys
from tests.support.threads import start_thread


@pytest.mark.django_db
def test_rotation_signs_with_a_new_key_and_keeps_publishing_the_old_one(agent: Agent):
    before = agent.invoke("core__get_current_time").json()["receipt"]
    old_kid = parts(before)[0]["kid"]

    out = StringIO()
    call_command("rotate_receipt_key", stdout=out)
    after = agent.invoke("core__get_current_time").json()["receipt"]

    new_kid = parts(after)[0]["kid"]
    assert new_kid != old_kid
    assert f"Signing with {new_kid}." in out.getvalue()
    jwks = published_keys()
    assert [k["kid"] for k in jwks["keys"]] == [new_kid, old_kid]
    old = SigningKey.objects.get(kid=old_kid)
    assert old.retires_at is not None
    longest = max(Tool.objects.values_list("timeout_ms", flat=True))
    assert (old.retires_at - timezone_now_of(old)).total_seconds() >= longest / 1000 + 60
    assert jwks["keys"][1]["toolhub_retires_at"] == keys.instant(old.retires_at)
    assert "toolhub_retires_at" not in jwks["keys"][0]
    assert "d" not in jwks["keys"][0] and "d" not in jwks["keys"][1]
    assert verify_receipt(before, jwks)["signedAt"] < jwks["keys"][1]["toolhub_retires_at"]
    assert verify_receipt(after, jwks)["invocationId"]


def timezone_now_of(key: SigningKey) -> datetime:
    """When the rotation happened: the new key's creation."""
    return SigningKey.objects.exclude(pk=key.pk).get(retires_at__isnull=True).created_at


@pytest.mark.django_db(transaction=True)
def test_calls_running_across_rotations_all_end_and_each_receipt_verifies_with_its_kid(
    agent: Agent, test_tools: list[str]
):
    allow(agent.tenant, *test_tools, name="test tools")
    receipts: list[str] = []
    failures: list[object] = []
    lock = threading.Lock()

    def calls() -> None:
        for _ in range(6):
            record = agent.invoke("test__sleep", args={"seconds": 0.05}).json()
            with lock:
                (receipts if record.get("ok") else failures).append(record.get("receipt") or record)

    threads = [start_thread(calls) for _ in range(3)]
    for _ in range(3):
        keys.rotate()
    for thread in threads:
        thread.join(timeout=60)

    assert failures == []
    assert len(receipts) == 18
    jwks = published_keys()
    assert len(jwks["keys"]) == 4
    for receipt in receipts:
        kid = parts(receipt)[0]["kid"]
        assert verify_receipt(receipt, {"keys": [k for k in jwks["keys"] if k["kid"] == kid]})


@pytest.mark.django_db
def test_a_signing_key_no_configured_fernet_key_decrypts_is_rotated_out_and_calls_go_on(
    agent: Agent,
):
    old_kid = SigningKey.objects.get(retires_at__isnull=True).kid
    with override_settings(TOOLHUB_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        crypto._fernet.cache_clear()
        keys.forget()
        try:
            record = agent.invoke("core__get_current_time").json()
        finally:
            crypto._fernet.cache_clear()
            keys.forget()

    assert record["ok"] is True, record
    kid = parts(record["receipt"])[0]["kid"]
    assert kid != old_kid
    assert SigningKey.objects.get(kid=old_kid).retires_at is not None
    assert verify_receipt(record["receipt"], published_keys())["invocationId"]
