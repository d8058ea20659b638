"""calls_per_minute: a sliding log shared through the database, exact retry hints, no
overrun under real concurrent requests (one Daphne, then two sharing the database)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.invocations.models import AdmittedCall, CallWindow, RunEvent
from apps.invocations.ratelimit import WINDOW
from apps.policies.models import Policy
from tests.approvals.support import drain_queue, logged_in, make_operator, post_decision
from tests.conftest import Agent, allow, make_agent
from tests.support.responses import failure, ok_result, record_of
from tests.support.server import daphne, invoke

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "test__echo"
CONFIRM = "test__confirm"


@pytest.fixture
def limited(agent: Agent, test_tools: list[str]) -> Agent:
    """`acme`'s agent, allowed the test tools under a policy with calls_per_minute=2."""
    limit(allow(agent.tenant, *test_tools, name="test tools"), 2)
    return agent


def limit(policy: Policy, calls_per_minute: int) -> None:
    policy.calls_per_minute = calls_per_minute
    policy.save()


def echo(agent: Agent, text: str = "hi", **body: Any) -> Any:
    return agent.invoke(ECHO, args={"text": text}, **body)


def admitted_at(agent: Agent) -> list:
    return list(
        AdmittedCall.objects.filter(window__principal=agent.principal)
        .order_by("at")
        .values_list("at", flat=True)
    )


def backdate(agent: Agent, *seconds_ago: float) -> None:
    """Move the principal's admissions into the past, oldest first."""
    now = timezone.now()
    entries = AdmittedCall.objects.filter(window__principal=agent.principal).order_by("at")
    for entry, ago in zip(entries, seconds_ago, strict=True):
        entry.at = now - timedelta(seconds=ago)
        entry.save()


def refused_after_ms(response: Any) -> int:
    code, message = failure(response)
    assert code == "rate_limited", message
    body = response.json()
    assert response["Retry-After"] == str(math.ceil(body["retryAfterMs"] / 1000))
    return int(body["retryAfterMs"])


# ---------------------------------------------------------------- in one process


def test_it_admits_the_limit_then_says_exactly_when_the_next_slot_frees(limited):
    ok_result(echo(limited, "1"))
    ok_result(echo(limited, "2"))
    oldest = admitted_at(limited)[0]

    before = timezone.now()
    response = echo(limited, "3")
    after = timezone.now()

    retry_ms = refused_after_ms(response)
    assert "2 calls per minute" in response.json()["safeMessage"]
    # The first admission frees its slot a minute after it was taken.
    assert (oldest + WINDOW - after).total_seconds() * 1000 <= retry_ms
    assert retry_ms <= math.ceil((oldest + WINDOW - before).total_seconds() * 1000)
    assert len(admitted_at(limited)) == 2  # the refused call took no slot


def test_the_retry_hint_follows_the_oldest_admission_in_the_window(limited):
    ok_result(echo(limited, "1"))
    ok_result(echo(limited, "2"))
    backdate(limited, 50, 30)

    retry_ms = refused_after_ms(echo(limited, "3"))

    assert 9_000 < retry_ms <= 10_000


def test_a_lowered_limit_waits_for_the_surplus_to_expire(limited):
    policy = Policy.objects.get(tenant=limited.tenant, name="test tools")
    limit(policy, 3)
    for text in "123":
        ok_result(echo(limited, text))
    backdate(limited, 50, 40, 30)
    limit(policy, 2)

    # Three admissions, room for two: the second oldest (40 s ago) must expire first.
    retry_ms = refused_after_ms(echo(limited, "4"))

    assert 19_000 < retry_ms <= 20_000


def test_a_slot_frees_once_its_admission_is_a_minute_old(limited):
    ok_result(echo(limited, "1"))
    ok_result(echo(limited, "2"))
    backdate(limited, 61, 10)

    assert ok_result(echo(limited, "3")) == {"text": "3"}
    assert len(admitted_at(limited)) == 2  # the expired entry is gone


def test_the_record_and_its_result_event_carry_the_retry_hint(limited):
    ok_result(echo(limited, "1"))
    ok_result(echo(limited, "2"))
    response = echo(limited, "3", runId="run-limited")
    retry_ms = refused_after_ms(response)

    record = record_of(response)
    assert record.retry_after_ms == retry_ms
    read_back = limited.client.get(f"/api/v1/invocations/{record.pk}/").json()
    assert read_back["retryAfterMs"] == retry_ms
    assert read_back["errorCode"] == "rate_limited"
    result_event = RunEvent.objects.get(
        tenant=limited.tenant, run_id="run-limited", type="tool_call_result"
    )
    assert result_event.message["retryAfterMs"] == retry_ms


def test_other_refusals_carry_no_retry_hint(limited):
    response = limited.invoke("test__nope")

    assert failure(response)[0] == "unavailable"
    assert "retryAfterMs" not in response.json()
    assert "Retry-After" not in response


def test_each_principal_has_its_own_window(limited):
    other = make_agent(limited.tenant.slug, "agent:other")
    ok_result(echo(limited, "1"))
    ok_result(echo(limited, "2"))

    assert ok_result(echo(other, "1")) == {"text": "1"}
    assert failure(echo(limited, "3"))[0] == "rate_limited"


def test_windows_idle_for_a_minute_are_purged_with_their_entries(limited):
    idle = CallWindow.objects.create(
        tenant=limited.tenant,
        principal="agent:gone",
        last_admitted_at=timezone.now() - timedelta(minutes=5),
    )
    AdmittedCall.objects.create(window=idle, at=idle.last_admitted_at)
    busy = CallWindow.objects.create(tenant=limited.tenant, principal="agent:busy")
    AdmittedCall.objects.create(window=busy, at=timezone.now())

    ok_result(echo(limited, "1"))

    assert not CallWindow.objects.filter(pk=idle.pk).exists()
    assert not AdmittedCall.objects.filter(window_id=idle.pk).exists()
    assert AdmittedCall.objects.filter(window=busy).count() == 1


def test_an_idempotent_retry_is_not_charged_against_the_limit(limited):
    first = echo(limited, "once", idempotencyKey="rl-key")
    ok_result(echo(limited, "other"))

    retry = echo(limited, "once", idempotencyKey="rl-key")

    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert len(admitted_at(limited)) == 2


def test_an_approved_call_is_not_charged_again_when_it_runs(limited):
    limit(Policy.objects.get(tenant=limited.tenant, name="test tools"), 1)
    held = limited.invoke(CONFIRM)
    assert held.status_code == 202, held.content
    operator = make_operator("oscar", limited.tenant, tools=(CONFIRM,))

    decided = post_decision(logged_in(operator), held.json()["approvalId"])
    assert decided.status_code == 200, decided.content
    drain_queue()

    record = record_of(held)
    record.refresh_from_db()
    assert (record.status, record.ok, record.error_code) == ("succeeded", True, "")
    assert len(admitted_at(limited)) == 1


# ---------------------------------------------------------------- real concurrent requests


def _post(base: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    """Status, JSON body and Retry-After header of one POST /api/v1/invocations/."""
    status, answer, headers = invoke(base, key, body)
    return status, answer, headers["Retry-After"]


def _burst(bases: list[str], key: str, calls: int) -> list[tuple[int, dict[str, Any], str | None]]:
    """`calls` simultaneous echo calls, spread over the servers in turn."""
    with ThreadPoolExecutor(calls) as pool:
        return list(
            pool.map(
                lambda i: _post(
                    bases[i % len(bases)], key, {"toolId": ECHO, "args": {"text": "x"}}
                ),
                range(calls),
            )
        )


def _assert_exactly_admitted(answers: list[tuple[int, dict[str, Any], str | None]], n: int) -> None:
    assert {status for status, _, _ in answers} == {200}, answers
    admitted = [body for _, body, _ in answers if body["ok"] is True]
    refused = [(body, retry) for _, body, retry in answers if body["ok"] is False]
    assert len(admitted) == n, [body.get("errorCode") for _, body, _ in answers]
    for body, retry_after in refused:
        assert body["errorCode"] == "rate_limited", body
        assert 0 < body["retryAfterMs"] <= 60_000
        assert retry_after == str(math.ceil(body["retryAfterMs"] / 1000))


@pytest.mark.server
def test_fifty_concurrent_requests_admit_exactly_ten(agent, test_tools):
    limit(allow(agent.tenant, ECHO), 10)

    with daphne() as base:
        answers = _burst([base], agent.key, 50)

    _assert_exactly_admitted(answers, 10)
    assert len(admitted_at(agent)) == 10


@pytest.mark.server
def test_two_servers_sharing_the_database_share_the_limit(agent, test_tools):
    limit(allow(agent.tenant, ECHO), 10)

    with daphne() as first, daphne() as second:
        answers = _burst([first, second], agent.key, 30)

    _assert_exactly_admitted(answers, 10)
    assert len(admitted_at(agent)) == 10
