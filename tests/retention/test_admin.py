"""The admin's retention policies: superusers only, 0 and negative days refused."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.retention.models import RetentionPolicy

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/retention/retentionpolicy/add/"


@pytest.fixture
def superuser_client(db) -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw-root-12345")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("days", ["0", "-5"])
def test_the_admin_refuses_zero_or_negative_days_with_a_clear_message(
    agent, superuser_client, days
):
    response = superuser_client.post(ADD, {"tenant": agent.tenant.pk, "days": days})

    assert response.status_code == 200
    assert "Retention is a whole number of days, at least 1" in response.content.decode()
    assert not RetentionPolicy.objects.exists()


def test_the_admin_saves_days_or_empty_for_the_default(agent, superuser_client):
    response = superuser_client.post(ADD, {"tenant": agent.tenant.pk, "days": ""})

    assert response.status_code == 302, response.content.decode()[:2000]
    assert RetentionPolicy.objects.get(tenant=agent.tenant).days is None


def test_staff_who_are_not_superusers_cannot_see_retention(agent, staff):
    client = Client()
    client.force_login(staff)

    assert client.get(ADD).status_code == 403
