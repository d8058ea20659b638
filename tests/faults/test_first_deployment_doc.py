"""docs/deployment.md's first-deployment steps, run as written and in the order written.

The block after the `first-deployment-steps` marker is run command by command with bash,
each with the environment file its first line sources (here a temporary one: SQLite in a
temporary TOOLHUB_VAR_DIR, an extra tool module, debug off), and each step's outcome is
checked: the checks pass, the migrations are applied and the extra module's tools are in the
catalog, static files are collected, the superuser and the operator have their email
addresses, the agent's key works, and the started Daphne answers /healthz and /readyz.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.support.processes import stop
from tests.support.server import ROOT, free_port, invoke

pytestmark = [pytest.mark.one_leg]

DOC = ROOT / "docs" / "deployment.md"
MARKER = "<!-- first-deployment-steps"
ENV_LINE = "set -a; . /etc/toolhub/env; set +a"
PASSWORD = "Correct-Horse-93-battery-staple"
EXTRA_MODULE = "tests.support.tools"


def documented_steps() -> list[str]:
    """The commands of the marked block: continuation lines joined, comment-only and
    blank lines dropped, trailing comments removed."""
    text = DOC.read_text()
    assert MARKER in text, "the first-deployment block lost its marker"
    block = text.split(MARKER, 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        line = re.sub(r"\s+#.*$", "", line).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        commands.append(pending + line.strip())
        pending = ""
    assert not pending, "the block ends inside a continued line"
    return commands


def test_the_block_starts_with_the_environment_and_ends_with_the_probes():
    steps = documented_steps()
    assert steps[0] == ENV_LINE
    assert [s for s in steps if s.startswith("curl")][-1].endswith("/readyz")
    names = [s.split()[2] if s.startswith("python manage.py") else s.split()[0] for s in steps]
    assert names.index("check") < names.index("migrate") < names.index("collectstatic")


@pytest.fixture
def deployment() -> Iterator[tuple[Path, dict[str, str]]]:
    with tempfile.TemporaryDirectory(prefix="first-deployment-") as tmp:
        var = Path(tmp) / "var"
        env_file = Path(tmp) / "env"
        env_file.write_text(
            f"TOOLHUB_VAR_DIR={var}\n"
            f"TOOLHUB_SECRET_KEY={Fernet.generate_key().decode()}{'k' * 20}\n"
            f"TOOLHUB_ENCRYPTION_KEY={Fernet.generate_key().decode()}\n"
            "TOOLHUB_ALLOWED_HOSTS=toolhub.example.com,127.0.0.1\n"
            f"TOOLHUB_EXTRA_TOOL_MODULES={EXTRA_MODULE}\n"
        )
        # Nothing of the test run's own settings leaks in: only the file configures toolhub.
        base = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "HOME": os.environ.get("HOME", tmp),
            "LANG": "C.UTF-8",
        }
        yield env_file, base


def run(env_file: Path, base: dict[str, str], command: str) -> str:
    done = subprocess.run(
        ["bash", "-c", f"set -a; . {env_file}; set +a; {command}"],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"daphne did not listen within 60 s:\n{log.read_text()}")


def wait_started(process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker logs its start (its signal handlers are set by then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")
        if "Starting worker" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the worker did not start within 60 s:\n{log.read_text()}")


def test_the_documented_first_deployment_runs_in_its_order(
    deployment: tuple[Path, dict[str, str]],
) -> None:
    env_file, base = deployment
    var = Path(env_file.read_text().split("TOOLHUB_VAR_DIR=", 1)[1].split("\n", 1)[0])
    port = free_port()
    steps = documented_steps()
    assert steps[0] == ENV_LINE
    placeholders = {"<long one>": PASSWORD, "8001": str(port)}
    background: list[tuple[str, subprocess.Popen[bytes]]] = []
    logs: list[Path] = []
    done: list[str] = []
    key = ""
    try:
        for step in steps[1:]:
            for placeholder, value in placeholders.items():
                step = step.replace(placeholder, value)
            assert "<" not in step, f"a placeholder the test does not fill: {step}"
            if step.endswith("&"):
                log = Path(tempfile.mkstemp(prefix="first-deployment-", suffix=".log")[1])
                logs.append(log)
                with log.open("wb") as output:
                    process = subprocess.Popen(
                        ["bash", "-c", f"set -a; . {env_file}; set +a; exec {step[:-1]}"],
                        cwd=ROOT,
                        env=base,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                name = "daphne" if step.startswith("daphne") else "toolhub_worker"
                background.append((name, process))
                if name == "daphne":
                    wait_listening(port, process, log)
                else:
                    wait_started(process, log)
                done.append(name)
                continue
            out = run(env_file, base, step)
            name = step.split()[2] if step.startswith("python manage.py") else step.split()[0]
            if "createsuperuser" in step:
                name = "createsuperuser"
            check_outcome(name, step, out, var)
            if name == "create_api_key":
                key = out.strip().splitlines()[-1]
            done.append(name)

        assert done == [
            "check", "migrate", "collectstatic", "createsuperuser", "create_tenant",
            "create_staff", "create_api_key", "allow_tool", "allow_tool", "daphne",
            "toolhub_worker", "curl", "curl",
        ]  # fmt: skip
        # The agent's key works against the started server, for the tool allowed at once.
        status, body, _ = invoke(
            f"http://127.0.0.1:{port}",
            key,
            {"toolId": "core__get_current_time", "args": {}, "runId": "first"},
        )
        assert status == 200 and body["ok"] is True, body
        for name, process in background:
            assert process.poll() is None, f"{name} exited early"
    finally:
        for _name, process in reversed(background):
            stop(process)
        for log in logs:
            log.unlink(missing_ok=True)
    # The worker, stopped with SIGTERM, exits cleanly: it had started with the extra module.
    assert dict(background)["toolhub_worker"].returncode == 0


def check_outcome(name: str, step: str, out: str, var: Path) -> None:
    database = var / "toolhub.sqlite3"
    if name == "check":
        assert "no issues" in out, out
        return
    if name == "collectstatic":
        assert (var / "staticfiles" / "admin" / "css" / "base.css").is_file()
        return
    if name == "curl":
        answer = json.loads(out)
        if step.endswith("/healthz"):
            assert answer == {"status": "ok"}
        else:
            assert answer == {"status": "ok", "checks": {"database": True, "channelLayer": True}}
        return
    with sqlite3.connect(database) as connection:
        cursor = connection.cursor()
        if name == "migrate":
            assert cursor.execute("SELECT count(*) FROM django_migrations").fetchone()[0] > 0
            tools = {row[0] for row in cursor.execute("SELECT id FROM tools_tool WHERE available")}
            assert {"core__get_current_time", "test__echo"} <= tools, tools
        elif name == "createsuperuser":
            row = cursor.execute(
                "SELECT is_superuser, email FROM auth_user WHERE username = 'you'"
            ).fetchone()
            assert row == (1, "you@example.com")
        elif name == "create_tenant":
            assert cursor.execute(
                "SELECT 1 FROM tenants_tenant WHERE slug = 'northwind'"
            ).fetchone()
        elif name == "create_staff":
            row = cursor.execute(
                "SELECT is_staff, is_superuser, email FROM auth_user WHERE username = 'nora'"
            ).fetchone()
            assert row == (1, 0, "nora@example.com")
            assert "operator of tenant northwind" in out
        elif name == "create_api_key":
            assert out.strip().splitlines()[-1]
        elif name == "allow_tool":
            assert "created" in out, out
        else:
            raise AssertionError(f"a step the test does not know: {step}")


def test_a_tool_module_that_does_not_import_fails_the_check(
    deployment: tuple[Path, dict[str, str]],
) -> None:
    env_file, base = deployment
    env_file.write_text(env_file.read_text().replace(EXTRA_MODULE, "nowhere_installed.tools"))
    done = subprocess.run(
        ["bash", "-c", f"set -a; . {env_file}; set +a; python manage.py check"],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "No module named 'nowhere_installed'" in done.stderr
