"""PostgreSQL's connection pool: on by default, sized from the environment, and refused
at start-up when its settings make no sense (toolhub/settings.py `_database`)."""

from __future__ import annotations

import importlib

import pytest
from django.core.exceptions import ImproperlyConfigured

from toolhub.db.postgresql.pool import check

PG_URL = "postgresql://toolhub@db.example:5432/toolhub?sslmode=require"
POOL_VARS = (
    "TOOLHUB_DB_POOL",
    "TOOLHUB_DB_POOL_MIN_SIZE",
    "TOOLHUB_DB_POOL_MAX_SIZE",
    "TOOLHUB_DB_POOL_TIMEOUT",
    "TOOLHUB_DB_PREPARED_STATEMENTS",
)


@pytest.fixture
def database(monkeypatch):
    """`_database` as settings.py calls it, with no pool variable from the caller's shell."""
    for name in POOL_VARS:
        monkeypatch.delenv(name, raising=False)
    return importlib.import_module("toolhub.settings")._database


def test_it_pools_postgresql_connections_by_default(database):
    config = database(PG_URL)
    assert config["ENGINE"] == "toolhub.db.postgresql"
    assert config["CONN_MAX_AGE"] == 0  # Django's pool refuses persistent connections
    pool = config["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"], pool["timeout"]) == (2, 20, 5)
    # A broken connection is checked out of the pool, not handed to a request.
    assert pool["check"] is check
    assert config["OPTIONS"]["sslmode"] == "require"  # the URL's own options stay


def test_it_sizes_the_pool_from_the_environment(database, monkeypatch):
    monkeypatch.setenv("TOOLHUB_DB_POOL_MIN_SIZE", "0")
    monkeypatch.setenv("TOOLHUB_DB_POOL_MAX_SIZE", "7")
    monkeypatch.setenv("TOOLHUB_DB_POOL_TIMEOUT", "12")
    pool = database(PG_URL)["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"], pool["timeout"]) == (0, 7, 12)


def test_it_connects_per_request_when_the_pool_is_turned_off(database, monkeypatch):
    monkeypatch.setenv("TOOLHUB_DB_POOL", "0")
    config = database(PG_URL)
    assert "pool" not in config["OPTIONS"]
    assert config["OPTIONS"]["prepare_threshold"] == 5  # prepared statements do not need it


def test_it_lets_prepared_cursors_prepare_unless_turned_off(database, monkeypatch):
    """Django sets psycopg's prepare_threshold to None (nothing is ever prepared) unless
    OPTIONS names one; toolhub names one for its prepared_cursor() (toolhub/db/postgresql)."""
    assert database(PG_URL)["OPTIONS"]["prepare_threshold"] == 5
    monkeypatch.setenv("TOOLHUB_DB_PREPARED_STATEMENTS", "off")  # a transaction-mode pooler
    options = database(PG_URL)["OPTIONS"]
    assert "prepare_threshold" not in options
    assert options["sslmode"] == "require"
    assert options["pool"]["max_size"] == 20


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("TOOLHUB_DB_POOL", "maybe", "TOOLHUB_DB_POOL must be one of"),
        ("TOOLHUB_DB_POOL_MIN_SIZE", "two", "TOOLHUB_DB_POOL_MIN_SIZE must be an integer"),
        ("TOOLHUB_DB_POOL_MIN_SIZE", "-1", "TOOLHUB_DB_POOL_MIN_SIZE must be at least 0"),
        ("TOOLHUB_DB_POOL_MAX_SIZE", "1.5", "TOOLHUB_DB_POOL_MAX_SIZE must be an integer"),
        ("TOOLHUB_DB_POOL_MAX_SIZE", "0", "TOOLHUB_DB_POOL_MAX_SIZE must be at least 1"),
        ("TOOLHUB_DB_POOL_MAX_SIZE", "-4", "TOOLHUB_DB_POOL_MAX_SIZE must be at least 1"),
        ("TOOLHUB_DB_POOL_TIMEOUT", "soon", "TOOLHUB_DB_POOL_TIMEOUT must be an integer"),
        ("TOOLHUB_DB_POOL_TIMEOUT", "0", "TOOLHUB_DB_POOL_TIMEOUT must be at least 1"),
        ("TOOLHUB_DB_POOL_TIMEOUT", "-3", "TOOLHUB_DB_POOL_TIMEOUT must be at least 1"),
        ("TOOLHUB_DB_PREPARED_STATEMENTS", "sometimes", "TOOLHUB_DB_PREPARED_STATEMENTS must"),
        ("TOOLHUB_DB_PREPARED_STATEMENTS", "5", "TOOLHUB_DB_PREPARED_STATEMENTS must"),
    ],
)
def test_it_refuses_a_bad_pool_setting_naming_it(database, monkeypatch, name, raw, says):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ImproperlyConfigured, match=says):
        database(PG_URL)


def test_it_refuses_a_minimum_above_the_maximum(database, monkeypatch):
    monkeypatch.setenv("TOOLHUB_DB_POOL_MIN_SIZE", "10")
    monkeypatch.setenv("TOOLHUB_DB_POOL_MAX_SIZE", "4")
    with pytest.raises(ImproperlyConfigured, match=r"MIN_SIZE \(10\) is larger than .*\(4\)"):
        database(PG_URL)


@pytest.mark.parametrize(
    ("name", "raw"), [("TOOLHUB_DB_POOL", "1"), ("TOOLHUB_DB_POOL_MAX_SIZE", "10")]
)
def test_it_refuses_pool_settings_on_sqlite(database, monkeypatch, tmp_path, name, raw):
    """A pool asked for on SQLite means DATABASE_URL is not what the operator thinks."""
    monkeypatch.setenv(name, raw)
    with pytest.raises(ImproperlyConfigured, match=r"settings are for PostgreSQL"):
        database(f"sqlite:///{tmp_path / 'db.sqlite3'}")


def test_sqlite_runs_without_a_pool_and_accepts_it_turned_off(database, monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert "pool" not in database(url)["OPTIONS"]
    monkeypatch.setenv("TOOLHUB_DB_POOL", "0")
    assert "pool" not in database(url)["OPTIONS"]
    monkeypatch.setenv("TOOLHUB_DB_PREPARED_STATEMENTS", "0")
    assert "prepare_threshold" not in database(url)["OPTIONS"]


def test_it_refuses_prepared_statements_asked_for_on_sqlite(database, monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLHUB_DB_PREPARED_STATEMENTS", "1")
    with pytest.raises(ImproperlyConfigured, match=r"PREPARED_STATEMENTS is for PostgreSQL"):
        database(f"sqlite:///{tmp_path / 'db.sqlite3'}")
