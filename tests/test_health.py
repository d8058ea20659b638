"""Liveness and readiness probes answer without credentials."""

from __future__ import annotations

import pytest
from django.test import Client


def test_healthz_answers_ok_without_authentication():
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"status": "ok"}


def test_healthz_does_not_touch_the_database():
    """No django_db mark: any query here would fail the test."""
    assert Client().get("/healthz").status_code == 200


@pytest.mark.django_db
def test_readyz_reports_the_database_and_channel_layer_reachable():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ok",
        "checks": {"database": True, "channelLayer": True},
    }


@pytest.mark.django_db
def test_readyz_is_503_when_the_channel_layer_is_unreachable(settings):
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_health.BrokenLayer"}}
    channel_layers.backends.clear()
    try:
        response = Client().get("/readyz")
    finally:
        channel_layers.backends.clear()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"] == {"database": True, "channelLayer": False}


class BrokenLayer:
    """A channel layer whose backing service is down."""

    extensions: list[str] = []

    def __init__(self, **kwargs: object) -> None:
        pass

    async def new_channel(self, prefix: str = "specific.") -> str:
        raise ConnectionError("redis is down")
