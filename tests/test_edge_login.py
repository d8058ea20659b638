"""Password logins are throttled per username and client address (django-axes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client

LOGIN = "/admin/login/"
HERE = "198.51.100.7"
ELSEWHERE = "203.0.113.9"


def log_in(username: str, password: str, address: str = HERE):
    return Client().post(
        LOGIN,
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )


def fail(times: int, username: str = "olivia", address: str = HERE) -> None:
    for _ in range(times):
        assert log_in(username, "wrong-password", address).status_code in (200, 429)


@pytest.fixture(autouse=True)
def quick_hashing(settings):
    """Wrong passwords are hashed too; the production hasher would make each try slow."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def other_staff(db: None) -> User:
    return User.objects.create_user("oscar", password="pw-oscar-123", is_staff=True)


def test_the_right_password_logs_in_after_fewer_failures_than_the_limit(staff):
    fail(settings.AXES_FAILURE_LIMIT - 1)
    assert log_in("olivia", "pw-olivia-123").status_code == 302


def test_after_the_limit_even_the_right_password_is_refused_with_a_clear_message(staff):
    fail(settings.AXES_FAILURE_LIMIT + 20)
    response = log_in("olivia", "pw-olivia-123")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins" in page
    assert "olivia" in page
    assert "_auth_user_id" not in response.client.session


def test_a_locked_pair_locks_neither_other_users_nor_other_addresses(staff, other_staff):
    fail(settings.AXES_FAILURE_LIMIT)
    assert log_in("olivia", "pw-olivia-123").status_code == 429
    assert log_in("oscar", "pw-oscar-123").status_code == 302
    assert log_in("olivia", "pw-olivia-123", ELSEWHERE).status_code == 302


def test_the_lock_expires_after_the_cool_off(staff):
    fail(settings.AXES_FAILURE_LIMIT)
    assert log_in("olivia", "pw-olivia-123").status_code == 429
    # As if the cool-off had passed since the last failure.
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert log_in("olivia", "pw-olivia-123").status_code == 302
