"""The result cache in Redis (REDIS_URL: shared by every process of a deployment), with a
real redis-server: a hit is read back from Redis, and a Redis that stops answering makes
every lookup a miss (the tool runs) rather than a failed call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings

from apps.tools.models import Tool
from tests.conftest import Agent, allow
from tests.support.redis import redis_server

pytestmark = [pytest.mark.one_leg]

TOOL = "test__counted_wait"


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def redis_caches(url: str) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "results": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "toolhub-results",
            "OPTIONS": {"socket_timeout": 1, "socket_connect_timeout": 1},
        },
    }


@pytest.fixture
def cached(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, TOOL)
    Tool.objects.filter(pk=TOOL).update(cache_ttl_s=60)
    return agent


def call(agent: Agent, trace: Path) -> dict[str, Any]:
    args = {"path": str(trace), "token": "r", "ms": 0}
    data: dict[str, Any] = agent.invoke(TOOL, args=args).json()
    return data


@pytest.mark.django_db
def test_a_result_is_kept_in_redis_and_answers_the_next_call(
    cached: Agent, redis_url: str, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    with override_settings(CACHES=redis_caches(redis_url)):
        caches["results"].clear()
        first = call(cached, trace)
        keys = redis.Redis.from_url(redis_url).keys("toolhub-results:*")
        second = call(cached, trace)
    assert first["ok"] is True and "cacheHit" not in first
    assert len(keys) == 1
    assert second["cacheHit"] is True and second["result"] == first["result"]


@pytest.mark.django_db
def test_a_redis_that_does_not_answer_is_a_miss_and_the_tool_runs(
    cached: Agent, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    with override_settings(CACHES=redis_caches("redis://127.0.0.1:1/0")):  # nothing listens
        first = call(cached, trace)
        second = call(cached, trace)
    assert first["ok"] is True and second["ok"] is True
    assert "cacheHit" not in second and second["result"]["executions"] == 2
