"""What a server process (toolhub/asgi.py) and a worker process (toolhub_worker) do as
they start, each checked in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import database_url

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import gc, json
before = gc.get_freeze_count()
import toolhub.asgi
from daphne import server
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "http": server.HTTPFactory.__name__,
    "ws": server.WebSocketFactory.__name__,
}))
"""


WORKER_PROBE = """
import django, gc, json
django.setup()
from django.core.management import call_command
before = gc.get_freeze_count()
call_command("toolhub_worker", batch=True)
print(json.dumps({"before": before, "frozen": gc.get_freeze_count()}))
"""


def probe(code: str, **env: str) -> dict[str, object]:
    """Runs `code` in a fresh interpreter; the JSON object it printed last."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
            "DJANGO_SETTINGS_MODULE": "toolhub.settings",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_server_process_freezes_its_start_up_objects_and_installs_its_daphne_parts():
    probe_ = probe(PROBE, TOOLHUB_EMBEDDED_WORKER="0")
    assert probe_["before"] == 0
    # Django, DRF, Channels and toolhub's apps: well over 100,000 objects on Python 3.12+.
    assert probe_["frozen"] > 100_000, probe_
    assert probe_["http"] == "LimitedHTTPFactory"
    assert probe_["ws"] == "FramingWebSocketFactory"


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_freezes_its_start_up_objects_before_it_takes_work():
    frozen = probe(WORKER_PROBE, DATABASE_URL=database_url())
    assert frozen["before"] == 0
    assert frozen["frozen"] > 100_000, frozen
