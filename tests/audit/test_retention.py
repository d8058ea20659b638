"""Issue 48, 3: the chain survives retention. A prune removes the chain's positions of
what it removed and leaves a checkpoint, itself chained; what remains verifies from it."""

from __future__ import annotations

import pytest
from joserfc.jwk import OKPKey

from apps.audit.models import AuditCheckpoint, AuditEntry, AuditHead, Kind
from apps.invocations.models import InvocationRecord, RunEvent
from apps.receipts import body, keys, verification
from apps.receipts.keys import Signer
from apps.retention import pruning
from tests.audit.support import calls, verify_audit, written_days_ago
from tests.retention.support import keep_for

pytestmark = pytest.mark.django_db


def test_a_prune_in_the_middle_leaves_a_checkpoint_the_rest_verifies_from(caller):
    old = calls(caller, "run-old", 3)
    written_days_ago(caller.tenant, old, 10)
    kept = calls(caller, "run-new", 2)
    code, out = verify_audit()
    assert code == 0, out
    entries_before = AuditEntry.objects.filter(tenant=caller.tenant).count()
    old_entries = AuditEntry.objects.filter(tenant=caller.tenant, run_id="run-old").count()

    keep_for(caller.tenant, 5)
    totals = pruning.prune([caller.tenant])
    assert totals.records == 3
    assert set(InvocationRecord.objects.values_list("pk", flat=True)) == {
        *(InvocationRecord.objects.get(pk=k).pk for k in kept)
    }
    mark = AuditCheckpoint.objects.get(tenant=caller.tenant)
    assert (mark.through_n, mark.entries) == (old_entries, old_entries)
    assert not AuditEntry.objects.filter(tenant=caller.tenant, n__lte=mark.through_n).exists()
    chained = AuditEntry.objects.get(tenant=caller.tenant, kind=Kind.CHECKPOINT)
    assert chained.n == entries_before + 1 and chained.digest == mark.digest()

    code, out = verify_audit()
    assert code == 0, out
    kid = verification.header_of(mark.signature)["kid"]
    assert (
        f"from checkpoint {mark.pk} (signed, kid {kid}): positions through #{mark.through_n} pruned"
    ) in out
    assert f"OK, {entries_before + 1 - old_entries} entries #{old_entries + 1}..#" in out


def test_a_tampered_checkpoint_breaks_the_chain(caller):
    old = calls(caller, "run-old", 2)
    written_days_ago(caller.tenant, old, 10)
    calls(caller, "run-new", 1)
    keep_for(caller.tenant, 5)
    pruning.prune([caller.tenant])
    mark = AuditCheckpoint.objects.get(tenant=caller.tenant)
    assert verification.header_of(mark.signature)["kid"] == keys.signer().kid
    checkpoint = AuditCheckpoint.objects.filter(pk=mark.pk)
    checkpoint.update(link="a" * 64)
    code, out = verify_audit()
    assert code == 1
    assert (
        f"#{mark.through_n}: checkpoint {mark.pk}: its fields differ from what its signature "
        "covers (link)"
    ) in out

    # Re-signed by a key toolhub never published: refused, and named.
    forger = OKPKey.generate_key("Ed25519", parameters={"kid": "forger"})
    forged = checkpoint.get()
    checkpoint.update(signature=Signer("forger", forger).sign(body.canonical(forged.body())))
    code, out = verify_audit()
    assert code == 1
    assert f"checkpoint {mark.pk}: its signature does not verify: Unknown kid 'forger'" in out

    # The checkpoint as it was, its chained entry edited: that entry's link breaks.
    checkpoint.update(link=mark.link, signature=mark.signature)
    assert verify_audit()[0] == 0
    chained = AuditEntry.objects.get(tenant=caller.tenant, kind=Kind.CHECKPOINT)
    AuditEntry.objects.filter(pk=chained.pk).update(digest="0" * 64)
    code, out = verify_audit()
    assert code == 1
    assert f"#{chained.n}: the link of checkpoint {mark.pk} (audit_auditcheckpoint)" in out


def test_an_event_deleted_outside_retention_is_still_named_after_a_prune(caller):
    old = calls(caller, "run-old", 2)
    written_days_ago(caller.tenant, old, 10)
    calls(caller, "run-new", 2)
    keep_for(caller.tenant, 5)
    pruning.prune([caller.tenant])
    assert verify_audit()[0] == 0
    victim = RunEvent.objects.filter(tenant=caller.tenant, run_id="run-new").order_by("seq")[1]
    pk = victim.pk
    victim.delete()
    code, out = verify_audit()
    assert code == 1
    assert f"event {pk} (invocations_runevent: run run-new #2) was deleted" in out
    head = AuditHead.objects.get(tenant=caller.tenant)
    assert head.broken_n is not None
