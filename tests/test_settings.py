"""Configuration comes from the environment only, and bad values stop start-up by name."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from toolhub.env import env_bool, env_int, env_list, env_secret, env_str

ROOT = Path(__file__).resolve().parent.parent
VAR = "TOOLHUB_TEST_SETTING"
DEV_DEFAULT = "dev-default-secret-for-tests-only-0000000000"


# ---------------------------------------------------------------- env_bool


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("False", False),
     ("no", False), ("off", False), ("", False)],
)  # fmt: skip
def test_env_bool_reads_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, default=not expected) is expected


def test_env_bool_uses_the_default_when_unset(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert env_bool(VAR, default=True) is True
    assert env_bool(VAR, default=False) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "yes!", "tru"])
def test_env_bool_refuses_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_bool(VAR)


# ---------------------------------------------------------------- env_int


def test_env_int_reads_an_integer_and_defaults_when_unset_or_blank(monkeypatch):
    monkeypatch.setenv(VAR, " 42 ")
    assert env_int(VAR, 7) == 42
    monkeypatch.setenv(VAR, "")
    assert env_int(VAR, 7) == 7
    monkeypatch.delenv(VAR)
    assert env_int(VAR, 7) == 7


@pytest.mark.parametrize("raw", ["ten", "1.5", "3e2", "0x10"])
def test_env_int_refuses_a_non_integer(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be an integer"):
        env_int(VAR, 7)


def test_env_int_refuses_values_out_of_range(monkeypatch):
    monkeypatch.setenv(VAR, "0")
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be at least 1"):
        env_int(VAR, 7, minimum=1, maximum=10)
    monkeypatch.setenv(VAR, "11")
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be at most 10"):
        env_int(VAR, 7, minimum=1, maximum=10)
    for edge in ("1", "10"):
        monkeypatch.setenv(VAR, edge)
        assert env_int(VAR, 7, minimum=1, maximum=10) == int(edge)


# ---------------------------------------------------------------- env_list / env_str


def test_env_list_splits_on_commas_and_trims(monkeypatch):
    monkeypatch.setenv(VAR, " a.example.com , b.example.com")
    assert env_list(VAR) == ["a.example.com", "b.example.com"]


def test_env_list_uses_the_default_when_unset_and_empty_when_blank(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert env_list(VAR, ["x"]) == ["x"]
    monkeypatch.setenv(VAR, "")
    assert env_list(VAR, ["x"]) == []


@pytest.mark.parametrize("raw", ["a,,b", "a,", ",a", "a, ,b"])
def test_env_list_refuses_an_empty_item(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_list(VAR)


def test_env_str_trims_and_defaults(monkeypatch):
    monkeypatch.setenv(VAR, "  value ")
    assert env_str(VAR) == "value"
    monkeypatch.delenv(VAR)
    assert env_str(VAR, "fallback") == "fallback"


# ---------------------------------------------------------------- env_secret


def test_env_secret_refuses_a_missing_secret_outside_debug(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_secret(VAR, debug=False, dev_default=DEV_DEFAULT)


@pytest.mark.parametrize(
    "raw", ["changeme", "CHANGEME", "secret", "django-insecure-" + "x" * 40, DEV_DEFAULT]
)
def test_env_secret_refuses_known_defaults(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_secret(VAR, debug=False, dev_default=DEV_DEFAULT)


def test_env_secret_refuses_a_known_default_even_in_debug(monkeypatch):
    monkeypatch.setenv(VAR, "changeme")
    with pytest.raises(ImproperlyConfigured, match=VAR):
        env_secret(VAR, debug=True, dev_default=DEV_DEFAULT)


def test_env_secret_refuses_a_short_key(monkeypatch):
    monkeypatch.setenv(VAR, "x" * 31)
    with pytest.raises(ImproperlyConfigured, match="at least 32"):
        env_secret(VAR, debug=False, dev_default=DEV_DEFAULT)


def test_env_secret_accepts_a_long_random_key(monkeypatch):
    key = secrets.token_urlsafe(40)
    monkeypatch.setenv(VAR, key)
    assert env_secret(VAR, debug=False, dev_default=DEV_DEFAULT) == key


def test_env_secret_returns_the_dev_default_in_debug_when_unset(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert env_secret(VAR, debug=True, dev_default=DEV_DEFAULT) == DEV_DEFAULT


# ---------------------------------------------------------------- start-up in a real process


def start_django(tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    """`django.setup()` in a fresh interpreter; every other required setting is valid."""
    environment = dict(os.environ)
    environment.update(
        DJANGO_SETTINGS_MODULE="toolhub.settings",
        TOOLHUB_VAR_DIR=str(tmp_path / "var"),
        TOOLHUB_ENCRYPTION_KEY=base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        PYTHONPATH=str(ROOT),
    )
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_start_up_without_a_secret_key_outside_debug_fails_naming_it(tmp_path):
    process = start_django(tmp_path, TOOLHUB_DEBUG="0", TOOLHUB_SECRET_KEY=None)
    assert process.returncode != 0
    assert "TOOLHUB_SECRET_KEY" in process.stderr
    assert "started" not in process.stdout


def test_start_up_with_a_default_secret_key_outside_debug_fails(tmp_path):
    process = start_django(tmp_path, TOOLHUB_DEBUG="0", TOOLHUB_SECRET_KEY="changeme")
    assert process.returncode != 0
    assert "TOOLHUB_SECRET_KEY" in process.stderr


def test_start_up_with_a_random_secret_key_outside_debug_succeeds(tmp_path):
    key = secrets.token_urlsafe(64)[:50]
    process = start_django(tmp_path, TOOLHUB_DEBUG="0", TOOLHUB_SECRET_KEY=key)
    assert process.returncode == 0, process.stderr
    assert "started" in process.stdout


def test_start_up_with_an_unreadable_debug_flag_fails_naming_it(tmp_path):
    process = start_django(tmp_path, TOOLHUB_DEBUG="banana")
    assert process.returncode != 0
    assert "TOOLHUB_DEBUG" in process.stderr


def test_start_up_with_a_bad_database_url_fails_naming_it(tmp_path):
    process = start_django(tmp_path, TOOLHUB_DEBUG="1", DATABASE_URL="nonsense://nowhere")
    assert process.returncode != 0
    assert "DATABASE_URL" in process.stderr


@pytest.mark.parametrize("raw", ["0", "-5", "many", "1.5"])
def test_start_up_with_a_bad_stream_queue_size_fails_naming_it(tmp_path, raw):
    process = start_django(tmp_path, TOOLHUB_DEBUG="1", TOOLHUB_WS_QUEUED_EVENTS=raw)
    assert process.returncode != 0
    assert "TOOLHUB_WS_QUEUED_EVENTS" in process.stderr


# ---------------------------------------------------------------- the default database


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="DATABASE_URL selects another database"
)
def test_the_default_database_is_sqlite():
    # Django's SQLite backend, with one process's writers queued (toolhub/db/sqlite3/base.py).
    assert settings.DATABASES["default"]["ENGINE"] == "toolhub.db.sqlite3"
    assert connection.vendor == "sqlite"


@pytest.mark.django_db
def test_sqlite_connections_run_in_wal_mode():
    if connection.vendor != "sqlite":
        pytest.skip("WAL is a SQLite setting")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0].lower() == "wal"


# ---------------------------------------------------------------- check --deploy


def documented_production_env() -> dict[str, str]:
    """The KEY=VALUE block under "Production environment" in docs/deployment.md."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    block = text.split("### Production environment", 1)[1].split("```sh\n", 1)[1]
    block = block.split("```", 1)[0]
    pairs = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    assert "TOOLHUB_SECURE_COOKIES" in pairs  # the block the docs mean, not another one
    pairs["TOOLHUB_SECRET_KEY"] = secrets.token_urlsafe(50)
    pairs["TOOLHUB_ENCRYPTION_KEY"] = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    return pairs


def check_deploy(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("TOOLHUB_", "DATABASE_URL"))
    }
    environment.update(env, TOOLHUB_VAR_DIR=str(tmp_path / "var"))
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    process = check_deploy(tmp_path, documented_production_env())
    assert process.returncode == 0, process.stdout + process.stderr
    assert "no issues" in process.stdout


def test_check_deploy_warns_when_the_https_settings_are_left_out(tmp_path):
    env = documented_production_env()
    del env["TOOLHUB_SECURE_COOKIES"], env["TOOLHUB_HSTS_SECONDS"]
    process = check_deploy(tmp_path, env)
    assert process.returncode != 0
    assert "security.W012" in process.stderr
    assert "security.W004" in process.stderr
