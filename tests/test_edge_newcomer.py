"""After `make run`, the README's management commands work as written, with no environment.

scripts/run keeps the secret and encryption keys in the var directory; settings read them
from there when the variables are unset. Without variables or files, start-up still fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import stop
from tests.support.server import free_port

pytestmark = [pytest.mark.server, pytest.mark.one_leg]

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


def run_demo_until_up(var: Path) -> None:
    """scripts/run as `make run` starts it, stopped once it serves."""
    port = free_port()
    env = {**clean_env(var), "TOOLHUB_PORT": str(port)}
    log = var.parent / "run.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["scripts/run"], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError("scripts/run did not serve within 180 s:\n" + log.read_text())
    finally:
        stop(process)


def test_the_readme_commands_work_after_make_run_without_any_environment(tmp_path):
    var = tmp_path / "var"
    run_demo_until_up(var)
    assert (var / "secret_key").stat().st_mode & 0o777 == 0o600

    tenant = manage(var, "create_tenant", "newco")
    assert tenant.returncode == 0, tenant.stderr
    issued = manage(var, "create_api_key", "--tenant", "newco", "--principal", "agent:x")
    assert issued.returncode == 0, issued.stderr
    raw = issued.stdout.strip().splitlines()[-1]

    check = manage(
        var,
        "shell",
        "-c",
        "from apps.tenants.models import ApiKey;"
        f"key = ApiKey.objects.for_raw_key({raw!r});"
        "print(key.tenant.slug, key.principal)",
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().splitlines()[-1] == "newco agent:x"


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
