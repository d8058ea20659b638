"""What importing the ASGI application does to the server process (toolhub/asgi.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_a_fresh_server_process_freezes_its_start_up_objects_and_installs_its_daphne_parts():
    env = {
        **os.environ,
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
        "TOOLHUB_EMBEDDED_WORKER": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["before"] == 0
    # Django, DRF, Channels and toolhub's apps: well over 100,000 objects on Python 3.12+.
    assert probe["frozen"] > 100_000, probe
    assert probe["http"] == "LimitedHTTPFactory"
    assert probe["ws"] == "FramingWebSocketFactory"
