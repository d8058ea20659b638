"""Issue 46: docs/mcp.md's commands for adding the git server, run exactly as written in a
shell like a newcomer's (no .venv/bin on PATH, no allowlist exported) against a fresh demo
database, list the server's tools as the doc says they do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

pytestmark = [pytest.mark.one_leg]
ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "mcp.md").read_text()


def adding_a_server() -> tuple[str, str]:
    """The first fenced shell block of "Adding a server", and the tool line it promises."""
    section = DOC.split("## Adding a server", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    promised = re.search(r"`(git: new tool mcp__git__\w+ \(disabled\))`", section)
    assert block and promised
    return block.group(1), promised.group(1)


def test_the_documented_commands_add_the_git_server_and_list_its_tools(tmp_path):
    commands, promised = adding_a_server()
    assert "mcp_add git" in commands and "mcp_sync git" in commands
    var = tmp_path / "var"
    var.mkdir()
    (var / "secret_key").write_text("doc-test-secret-" + "k" * 50)
    (var / "encryption_key").write_text(Fernet.generate_key().decode())
    own_bin = os.path.dirname(sys.executable)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOOLHUB_", "DATABASE_URL", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != own_bin
    )
    env["TOOLHUB_VAR_DIR"] = str(var)

    def shell(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    demo = shell(
        ".venv/bin/python manage.py migrate --noinput -v0 && .venv/bin/python manage.py seed_demo"
    )
    assert demo.returncode == 0, demo.stderr
    done = shell(commands)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Registered MCP server git" in done.stdout
    assert promised in done.stdout
    assert re.search(r"git: \d+ new, .* 0 errors", done.stdout), done.stdout
