"""Without the variables or the key files `make run` keeps in var/, start-up fails and
says why; a key file holding a known default is refused like the variable. (That the
README's management commands work after `make run`: tests/test_readme_commands.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.one_leg]

ROOT = Path(__file__).resolve().parent.parent


def clean_env(var: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: no toolhub variables but where var/ is.

    TOOLHUB_VAR_DIR only keeps this test out of the checkout's own var/ (its default).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLHUB_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env["TOOLHUB_VAR_DIR"] = str(var)
    return env


def manage(var: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=clean_env(var),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_variables_or_key_files_start_up_still_fails(tmp_path):
    process = manage(tmp_path / "var", "create_tenant", "newco")
    assert process.returncode != 0
    assert "TOOLHUB_SECRET_KEY is missing" in process.stderr


def test_a_key_file_with_a_known_default_is_refused_like_the_variable(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    (var / "secret_key").write_text("changeme\n")
    (var / "encryption_key").write_text("unused\n")
    process = manage(var, "check")
    assert process.returncode != 0
    assert "TOOLHUB_SECRET_KEY" in process.stderr
