"""The README works as written: its quickstart's shell blocks run, in order, in a copy of
the project (so `var/` is the copy's), against the demo `make run` starts there; so do its
management commands, with no environment.

The one liberty taken: the port. The README says 8000; the copy's server gets a free port
(`TOOLHUB_PORT`, which the README names) and the commands are run with 8000 replaced by
it, so a toolhub already on 8000 cannot answer in its place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import free_port

pytestmark = pytest.mark.one_leg

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = re.compile(r"^[A-Z_]+=\S")
BLOCK = re.compile(r"^\s*```sh\n(?P<body>.*?)^\s*```", re.S | re.M)


def shell_blocks() -> list[str]:
    """The README's ```sh blocks, dedented (some sit in a list item)."""
    blocks = []
    for match in BLOCK.finditer((ROOT / "README.md").read_text()):
        lines = match["body"].splitlines()
        indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
        blocks.append("\n".join(line[indent:] for line in lines))
    return blocks


def block_with(text: str) -> str:
    (found,) = [block for block in shell_blocks() if text in block]
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, dict[str, str]]]:
    """A copy of the project (tracked files, modification times kept so `make` does not
    rebuild the venv it links to), running `make run` on a free port."""
    copy = tmp_path_factory.mktemp("readme") / "toolhub"
    tracked = (
        subprocess.run(
            ["git", "ls-files", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    # The venv is the checkout's, built by the test command: `make` in the copy must not
    # reinstall into it (an editable install would then point at this temporary copy).
    stamp = ROOT / ".venv" / ".installed"
    if stamp.exists():
        before = stamp.stat().st_mtime - 1
        for name in ("pyproject.toml", "clients/python/pyproject.toml"):
            os.utime(copy / name, (before, before))
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOOLHUB_", "DJANGO_", "DATABASE_URL", "REDIS_URL"))
    }
    env["TOOLHUB_PORT"] = str(port)
    log = (copy / "run.log").open("w")
    server = subprocess.Popen(
        ["bash", "-c", block_with("make run")],
        cwd=copy,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (copy / "run.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (copy / "run.log").read_text()[-3000:]
                time.sleep(0.5)
        yield copy, port, env
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def run(demo: tuple[Path, int, dict[str, str]], block: str) -> list[dict]:
    """Run a block in the copy with bash -e, after the README's variable assignments (one
    shell session, as a reader's); each curl's answer, as JSON, in order."""
    copy, port, env = demo
    assignments = [
        line for text in shell_blocks() for line in text.splitlines() if ASSIGNMENT.match(line)
    ]
    script = "\n".join(
        [*assignments, *(line for line in block.splitlines() if line not in assignments)]
    ).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    done = subprocess.run(
        ["bash", "-e", "-c", script.replace("curl ", "curl -sS --fail-with-body -w '\\n' ")],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_the_quickstart_calls_list_the_tools_and_run_one(demo):
    tools, call = run(demo, block_with("/api/v1/tools/"))
    assert "core__get_current_time" in {tool["id"] for tool in tools["tools"]}
    assert call["ok"] is True and call["status"] == "succeeded", call


def test_the_send_email_example_is_held_for_approval(demo):
    (held,) = run(demo, block_with("core__send_email"))
    assert held["status"] == "pending_approval" and held["approvalId"], held


def readme_command(name: str, slug: str) -> list[str]:
    """The README's inline `.venv/bin/python manage.py <name> ...` command, `<slug>` filled."""
    readme = (ROOT / "README.md").read_text()
    (found,) = re.findall(rf"`(\.venv/bin/python manage\.py {name} [^`]*)`", readme)
    return found.replace("<slug>", slug).split()


def test_the_management_commands_work_after_make_run_without_any_environment(demo):
    """The README's create_tenant and create_api_key, run as written in the demo's copy with
    no toolhub variable set: settings read the keys `make run` kept in var/."""
    copy, _port, env = demo
    assert (copy / "var" / "secret_key").stat().st_mode & 0o777 == 0o600

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=copy, env=env, capture_output=True, text=True, timeout=120
        )

    tenant = manage(*readme_command("create_tenant", "newco"))
    assert tenant.returncode == 0, tenant.stderr
    issued = manage(*readme_command("create_api_key", "newco"))
    assert issued.returncode == 0, issued.stderr
    raw = issued.stdout.strip().splitlines()[-1]
    check = manage(
        ".venv/bin/python",
        "manage.py",
        "shell",
        "-c",
        "from apps.tenants.models import ApiKey;"
        f"key = ApiKey.objects.for_raw_key({raw!r});"
        "print(key.tenant.slug, key.principal)",
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().splitlines()[-1] == "newco agent:x"


@pytest.mark.parametrize("interpreter", ["python3.11", "python3.13"])
def test_manage_py_under_a_python_that_is_not_the_projects_says_which_to_use(interpreter):
    """A shell's `python` may be another interpreter: 3.11 (too old) or a 3.13 without
    toolhub's dependencies. Either says what to run instead, not a traceback."""
    version = interpreter.removeprefix("python")
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python3"))
    found = str(pyenv[0]) if pyenv else shutil.which(interpreter)
    if found is None:
        pytest.skip(f"no {interpreter} on this machine")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        [found, "-I", "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert ".venv/bin/python manage.py" in done.stderr
    assert sys.executable != found
