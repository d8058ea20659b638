"""The worker prunes on a schedule: its sweeper starts a pass when one is due."""

from __future__ import annotations

import time

import pytest

from apps.approvals.worker import Sweeper
from apps.invocations.models import InvocationRecord
from apps.retention import schedule
from tests.retention.support import age, call, keep_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_pass_yet(monkeypatch):
    """Each test starts as a fresh worker would: no pass run yet."""
    monkeypatch.setattr(schedule, "_last_start", None)
    monkeypatch.setattr(schedule, "_running", None)


def test_a_tick_starts_one_pass_and_the_next_waits_for_the_interval(agent, settings):
    settings.TOOLHUB_RETENTION_EVERY_S = 3600
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 2), 31)

    thread = schedule.tick()
    assert thread is not None
    thread.join(30)
    age(call(agent, "run-b", 1), 31)

    assert schedule.tick() is None  # not due for an hour
    assert list(InvocationRecord.objects.values_list("run_id", flat=True)) == ["run-b"]


def test_the_workers_sweeper_prunes(agent, settings):
    settings.TOOLHUB_RETENTION_EVERY_S = 3600
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 3), 31)
    sweeper = Sweeper(every=0.05)
    sweeper.start()
    try:
        deadline = time.monotonic() + 30
        while InvocationRecord.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sweeper.stopped.set()
        sweeper.join(10)
        if schedule._running is not None:
            schedule._running.join(30)

    assert not InvocationRecord.objects.exists()


def test_a_pass_forgets_expired_oauth_tokens_and_keeps_live_ones(agent, settings):
    from datetime import timedelta

    from django.utils import timezone
    from oauth2_provider.models import AccessToken, Application

    settings.TOOLHUB_OAUTH_SERVER = True
    app = Application.objects.create(
        name="c",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://127.0.0.1:9/cb",
    )
    now = timezone.now()
    AccessToken.objects.create(application=app, token="old", expires=now - timedelta(hours=1))
    AccessToken.objects.create(application=app, token="live", expires=now + timedelta(hours=1))

    thread = schedule.tick()
    assert thread is not None
    thread.join(30)

    assert list(AccessToken.objects.values_list("token", flat=True)) == ["live"]
