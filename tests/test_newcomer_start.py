"""Issue 46, the newcomer's start: the demo banner names the console and the demo chat,
and manage.py commands do not print django-axes' start-up line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_the_demo_banner_lists_the_console_and_the_demo_chat(tmp_path):
    out = io.StringIO()
    call_command("seed_demo", "--key-file", str(tmp_path / "key"), "--port", "8123", stdout=out)
    banner = out.getvalue()
    assert "  console:   http://127.0.0.1:8123/console/" in banner
    assert "  demo chat: http://127.0.0.1:8123/demo/chat/" in banner
    assert "  admin:     http://127.0.0.1:8123/admin/" in banner


@pytest.mark.one_leg
@pytest.mark.parametrize("args", [["--help"], ["check"]])
def test_manage_py_does_not_print_the_axes_begin_line(args):
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "AXES" not in done.stdout + done.stderr
    assert "BEGIN version" not in done.stdout + done.stderr
