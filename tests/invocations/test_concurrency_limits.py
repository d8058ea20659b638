"""Concurrency limits (issue 44, item 3): a tool's and a tenant's, shared by every process
through the database, with slots that are leases and threads that are accounted for.

Overlap is counted by the tools themselves (tests/support/limited_tools.py), never
inferred from timing. Waits are bounded by TOOLHUB_CONCURRENCY_WAIT_S, shortened here.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from apps.invocations import concurrency
from apps.invocations.models import ConcurrencySlot, InvocationRecord
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import Agent, allow
from tests.support import limited_tools
from tests.support.limited_tools import GATE, GATED, NOOP, STUBBORN, STUBBORN_ID
from tests.support.threads import start_thread
from toolhub.ops import exposition, metrics

pytestmark = pytest.mark.django_db(transaction=True)

STORM = 8
LIMIT = 2


@pytest.fixture
def limited(agent: Agent, settings: Any) -> Iterator[Agent]:
    """The limited tools registered and allowed; a short wait for a slot."""
    for contract in limited_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
    Tool.objects.sync_registry(registry)
    allow(agent.tenant, *(c.id for c in limited_tools.CONTRACTS), name="limits")
    settings.TOOLHUB_CONCURRENCY_WAIT_S = 0.3
    for gate in (GATE, STUBBORN):
        gate.reset()
    yield agent
    GATE.opened.set()
    STUBBORN.opened.set()
    for contract in limited_tools.CONTRACTS:
        registry.unregister(contract.id)
    Tool.objects.sync_registry(registry)


def set_limit(tool_id: str, limit: int | None) -> None:
    tool = Tool.objects.get(pk=tool_id)
    tool.max_concurrency = limit
    tool.save()


def client_of(agent: Agent) -> APIClient:
    client = APIClient()  # one per thread
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
    return client


def invoke_later(agent: Agent, tool_id: str, answers: queue.Queue[Any], **body: Any) -> None:
    def call() -> None:
        response = client_of(agent).post(
            "/api/v1/invocations/", {"toolId": tool_id, **body}, format="json"
        )
        answers.put(response)

    start_thread(call)


def entered(gate: limited_tools.Gate, n: int = 1) -> None:
    for _ in range(n):
        assert gate.entered.acquire(timeout=15), "a call never reached the tool"


def no_slots_left(timeout: float = 10.0) -> bool:
    """Slots are given back by the tools' threads as they end."""
    end = time.monotonic() + timeout
    while ConcurrencySlot.objects.exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def no_lingering(tool_id: str, timeout: float = 10.0) -> bool:
    """A lingering thread is counted off by its future's done callback, which runs just
    after the tool's code returns (so after the tool says it exited)."""
    end = time.monotonic() + timeout
    while concurrency.lingering.of(tool_id):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def refusal_counts(outcome: str, tool_id: str) -> int:
    return sum(
        n
        for (what, _, tool), n in concurrency.counts.snapshot().items()
        if what == outcome and tool == tool_id
    )


def test_a_retry_storm_at_a_limit_of_2_runs_2_at_once_and_refuses_the_rest_with_a_hint(
    limited,
):
    set_limit(GATED, LIMIT)
    refused_before = refusal_counts("refused", GATED)
    answers: queue.Queue[Any] = queue.Queue()
    for n in range(STORM):
        invoke_later(limited, GATED, answers, runId="run-storm", toolCallId=f"storm-{n}")
    entered(GATE, LIMIT)
    # The others wait for a slot, then are refused while the two still hold theirs.
    refused = [answers.get(timeout=30) for _ in range(STORM - LIMIT)]
    assert GATE.entries == LIMIT
    GATE.opened.set()
    ran = [answers.get(timeout=30) for _ in range(LIMIT)]

    assert GATE.most == LIMIT  # never more than two inside the tool at once
    for response in refused:
        body = response.json()
        assert body["ok"] is False and body["errorCode"] == "rate_limited", body
        assert "Concurrency limit reached" in body["safeMessage"]
        assert f"{GATED} runs at most 2 call(s) at once" in body["safeMessage"]
        assert body["retryAfterMs"] >= 1
        assert int(response["Retry-After"]) >= 1
    assert [r.json()["ok"] for r in ran] == [True, True]
    # None lost: every call has its record, each ended.
    records = InvocationRecord.objects.filter(run_id="run-storm")
    assert records.count() == STORM
    assert sorted(records.values_list("error_code", flat=True)) == [""] * 2 + ["rate_limited"] * (
        STORM - LIMIT
    )
    assert no_slots_left()  # none leaked
    assert refusal_counts("refused", GATED) - refused_before == STORM - LIMIT
    # The limit is free again: the next call runs.
    GATE.reset()
    GATE.opened.set()
    assert limited.invoke(GATED).json()["ok"] is True


def test_a_waiting_call_runs_when_a_slot_frees(limited, settings):
    settings.TOOLHUB_CONCURRENCY_WAIT_S = 20
    set_limit(GATED, 1)
    answers: queue.Queue[Any] = queue.Queue()
    invoke_later(limited, GATED, answers, runId="run-wait")
    entered(GATE)
    invoke_later(limited, GATED, answers, runId="run-wait")
    # The second call can only be waiting for the slot: it never got into the tool.
    assert not GATE.entered.acquire(timeout=0.5)
    GATE.opened.set()
    first, second = answers.get(timeout=30), answers.get(timeout=30)
    assert (first.json()["ok"], second.json()["ok"]) == (True, True)
    assert GATE.most == 1 and GATE.entries == 2
    assert no_slots_left()


def test_a_tenant_limit_holds_across_its_tools_and_not_for_other_tenants(limited, stranger):
    limited.tenant.max_concurrent_calls = 1
    limited.tenant.full_clean()
    limited.tenant.save()
    answers: queue.Queue[Any] = queue.Queue()
    invoke_later(limited, GATED, answers)
    entered(GATE)

    refused = limited.invoke(NOOP).json()  # another tool, same tenant: no slot
    assert refused["errorCode"] == "rate_limited", refused
    assert "this tenant runs at most 1 call(s) at once" in refused["safeMessage"]
    allow(stranger.tenant, NOOP, name="limits")
    assert stranger.invoke(NOOP).json()["ok"] is True  # another tenant: its own count

    GATE.opened.set()
    assert answers.get(timeout=30).json()["ok"] is True
    assert no_slots_left()
    assert limited.invoke(NOOP).json()["ok"] is True


def test_a_timed_out_call_keeps_its_slot_until_its_thread_really_ends(limited):
    set_limit(STUBBORN_ID, 1)
    timed_out = limited.invoke(STUBBORN_ID).json()
    assert timed_out["errorCode"] == "timeout", timed_out
    assert concurrency.lingering.of(STUBBORN_ID) == 1
    assert ConcurrencySlot.objects.filter(tool_id=STUBBORN_ID).count() == 1

    refused = limited.invoke(STUBBORN_ID).json()  # the thread still runs: no slot
    assert refused["errorCode"] == "rate_limited", refused
    assert STUBBORN.entries == 1

    STUBBORN.opened.set()
    assert STUBBORN.exited.acquire(timeout=15)
    assert no_slots_left()
    assert no_lingering(STUBBORN_ID)
    assert limited.invoke(STUBBORN_ID).json()["ok"] is True


def test_lingering_threads_of_a_tool_are_capped_without_any_limit(limited, settings):
    settings.TOOLHUB_TOOL_LINGERING_PER_TOOL = 1
    assert limited.invoke(STUBBORN_ID).json()["errorCode"] == "timeout"

    response = limited.invoke(STUBBORN_ID)
    body = response.json()
    assert body["errorCode"] == "unavailable", body
    assert "outlived their deadline and still hold threads" in body["safeMessage"]
    assert body["retryAfterMs"] >= 1 and int(response["Retry-After"]) >= 1
    assert STUBBORN.entries == 1  # the refused call took no thread
    assert limited.invoke(NOOP).json()["ok"] is True  # other tools are not held back

    STUBBORN.opened.set()
    assert STUBBORN.exited.acquire(timeout=15)
    assert no_lingering(STUBBORN_ID)
    assert limited.invoke(STUBBORN_ID).json()["ok"] is True


def test_a_slot_left_by_a_dead_process_frees_itself_when_its_lease_runs_out(limited):
    set_limit(NOOP, 1)
    now = timezone.now()
    # The row a process leaves when it dies mid-call: nobody renews its lease any more.
    dead = ConcurrencySlot.objects.create(
        tenant=limited.tenant,
        tool_id=NOOP,
        acquired_at=now - timedelta(minutes=5),
        ends_by=now - timedelta(minutes=4),
        expires_at=now + timedelta(minutes=1),
    )
    assert limited.invoke(NOOP).json()["errorCode"] == "rate_limited"  # its lease holds

    ConcurrencySlot.objects.filter(pk=dead.pk).update(expires_at=now - timedelta(seconds=1))
    assert limited.invoke(NOOP).json()["ok"] is True
    assert not ConcurrencySlot.objects.filter(pk=dead.pk).exists()
    assert no_slots_left()


def test_a_running_thread_renews_its_lease(limited):
    set_limit(GATED, 1)
    answers: queue.Queue[Any] = queue.Queue()
    invoke_later(limited, GATED, answers)
    entered(GATE)
    slot = ConcurrencySlot.objects.get(tool_id=GATED)
    ConcurrencySlot.objects.filter(pk=slot.pk).update(expires_at=timezone.now())
    concurrency.keeper.renew(sorted(concurrency.keeper.held()))
    slot.refresh_from_db()
    assert slot.expires_at > timezone.now() + timedelta(seconds=concurrency.LEASE_S - 5)
    GATE.opened.set()
    assert answers.get(timeout=30).json()["ok"] is True
    assert no_slots_left()


@pytest.mark.parametrize("value", [0, -1])
def test_a_limit_below_1_is_refused_at_save(limited, value):
    tool = Tool.objects.get(pk=NOOP)
    tool.max_concurrency = value
    with pytest.raises(ValidationError) as refused:
        tool.full_clean()
    assert "max_concurrency" in refused.value.message_dict
    tenant = Tenant.objects.get(pk=limited.tenant.pk)
    tenant.max_concurrent_calls = value
    with pytest.raises(ValidationError) as refused:
        tenant.full_clean()
    assert "max_concurrent_calls" in refused.value.message_dict
    # A write that skips validation is refused by the database.
    with pytest.raises(IntegrityError), transaction.atomic():
        Tool.objects.filter(pk=NOOP).update(max_concurrency=value)
    with pytest.raises(IntegrityError), transaction.atomic():
        Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_calls=value)


def test_the_admin_refuses_a_limit_of_0(limited, admin_client):
    response = admin_client.post(
        f"/admin/tools/tool/{NOOP}/change/", {"enabled": "on", "max_concurrency": "0"}
    )
    assert response.status_code == 200  # the form again, with the error
    assert "Ensure this value is greater than or equal to 1." in response.content.decode()
    assert Tool.objects.get(pk=NOOP).max_concurrency is None


def test_metrics_show_slots_in_use_and_refusals(limited):
    set_limit(GATED, 1)
    answers: queue.Queue[Any] = queue.Queue()
    invoke_later(limited, GATED, answers)
    entered(GATE)
    assert limited.invoke(GATED).json()["errorCode"] == "rate_limited"

    families = {
        family.name: family.samples
        for family in text_string_to_metric_families(exposition.text(metrics.registry).decode())
    }
    in_use = {
        (s.labels["tenant"], s.labels["tool"]): s.value
        for s in families["toolhub_concurrency_slots_in_use"]
    }
    assert in_use[("acme", GATED)] == 1
    refused = [
        s
        for s in families["toolhub_concurrency_calls"]
        if s.labels == {"outcome": "refused", "tenant": "acme", "tool": GATED}
    ]
    assert refused and refused[0].value >= 1
    GATE.opened.set()
    assert answers.get(timeout=30).json()["ok"] is True
    assert no_slots_left()
