"""Issue 46, docs/mcp.md as written: a stdio server's program is found next to toolhub's
interpreter, and one that does not start says why (its stderr's tail, for staff only)."""

from __future__ import annotations

import io
import os
import subprocess

import pytest
from django.core.management import CommandError, call_command

from apps.mcp.models import McpServer
from apps.mcp.sessions import STDERR_TAIL_CHARS, Endpoint, ServerUnavailable, pool

pytestmark = pytest.mark.django_db(transaction=True)


def sync(name: str) -> str:
    out = io.StringIO()
    with pytest.raises(CommandError, match=f"sync failed for {name}"):
        call_command("mcp_sync", name, stdout=out, stderr=out)
    return out.getvalue()


@pytest.fixture
def repository(tmp_path):
    path = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_a_program_installed_in_toolhubs_venv_is_found_without_it_on_path(monkeypatch):
    # A shell without any venv's bin on PATH (the caller's PATH may name another copy of
    # the venv, e.g. a worktree's symlink to it): only toolhub's own venv can find it.
    path = os.pathsep.join(
        p
        for p in os.environ["PATH"].split(os.pathsep)
        if not os.path.exists(os.path.join(p or ".", "mcp-server-time"))
    )
    monkeypatch.setenv("PATH", path)
    import shutil

    assert shutil.which("mcp-server-time") is None  # as in a shell without .venv/bin
    out = io.StringIO()
    call_command("mcp_add", "time", "--command", "mcp-server-time")
    call_command("mcp_sync", "time", stdout=out)
    assert "new tool mcp__time__get_current_time (disabled)" in out.getvalue()


def test_a_program_found_nowhere_is_named(settings):
    settings.TOOLHUB_MCP_STDIO_COMMANDS = ["mcp-server-nowhere"]
    call_command("mcp_add", "gone", "--command", "mcp-server-nowhere --flag")
    assert "the program 'mcp-server-nowhere' was not found on PATH nor in" in sync("gone")


def test_a_bad_repository_path_shows_the_servers_stderr_to_staff_not_agents(repository):
    missing = repository.parent / "no-such-repo"
    call_command("mcp_add", "git", "--command", f"mcp-server-git --repository {missing}")
    out = sync("git")
    assert "listing failed: the server closed the connection; its stderr ended with:" in out
    assert f"{missing} does not exist" in out
    assert f"{missing} does not exist" in McpServer.objects.get(name="git").last_error
    # What a caller of its tools is told (ServerUnavailable.for_agent) leaves it out.
    endpoint = Endpoint(server="git", argv=("mcp-server-git", "--repository", str(missing)))
    with pytest.raises(ServerUnavailable) as failed:
        pool.list_tools(endpoint, timeout=30)
    assert "does not exist" in str(failed.value)
    assert failed.value.for_agent == "the server closed the connection"


def test_the_stderr_tail_is_capped_and_scrubbed_of_control_characters():
    noise = (
        "import sys; sys.stderr.write('x' * 5000 + '\\x1b[31mred\\x1b[0m\\x07 end\\r\\n'); "
        "sys.exit(3)"
    )
    call_command("mcp_add", "noisy", "--command", f'python -c "{noise}"')
    out = sync("noisy")
    said = out.split("its stderr ended with:\n", 1)[1]
    said = said.splitlines()[0] if said else said
    assert said.endswith("xxxred end")
    assert len(said) <= STDERR_TAIL_CHARS
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
