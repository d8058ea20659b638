"""TOOLHUB_RETENTION_DAYS: unset keeps everything; 0 or less stops start-up by name."""

from __future__ import annotations

import pytest

from tests.test_settings import start_django

pytestmark = pytest.mark.one_leg


@pytest.mark.parametrize("days", ["0", "-1"])
def test_a_deployment_retention_of_zero_or_negative_days_stops_start_up(tmp_path, days):
    process = start_django(tmp_path, TOOLHUB_RETENTION_DAYS=days)

    assert process.returncode != 0
    assert f"TOOLHUB_RETENTION_DAYS must be at least 1; got {days}" in process.stderr
    assert "started" not in process.stdout


def test_an_empty_deployment_retention_keeps_everything(tmp_path):
    process = start_django(tmp_path, TOOLHUB_RETENTION_DAYS="")

    assert process.returncode == 0, process.stderr
    assert "started" in process.stdout
