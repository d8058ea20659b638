"""The result cache of read-only tools (apps/invocations/result_cache.py): a repeated call
answers from the cache after every check passed; any edit of the tool, a policy or a
connection makes the next call run again; hits show in the record, the event and /metrics.

The tool is test__counted_wait: each run appends a line to a file and answers how many
runs wrote that token, so a hit (the count stays) and a run (the count grows) differ."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from apps.invocations.models import InvocationRecord, RunEvent
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tools.models import CacheScope, Tool
from tests.conftest import Agent, allow, make_agent
from tests.connections import make_connection

TOOL = "test__counted_wait"
TOKEN = "m" * 40


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    """A rolled-back test can bring an epoch value back: no entry may outlive its test."""
    caches["results"].clear()
    yield
    caches["results"].clear()


@pytest.fixture
def cached(agent: Agent, test_tools: list[str]) -> Tool:
    allow(agent.tenant, TOOL)
    tool = Tool.objects.get(pk=TOOL)
    tool.cache_ttl_s = 60
    tool.save()
    return tool


def call(agent: Agent, trace: Path, token: str = "a", **body: Any) -> dict[str, Any]:
    response = agent.invoke(TOOL, args={"path": str(trace), "token": token, "ms": 0}, **body)
    assert response.status_code == 200, response.content
    data: dict[str, Any] = response.json()
    return data


def runs(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


@pytest.mark.django_db
def test_a_repeated_call_answers_from_the_cache_without_running(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    first = call(agent, trace, runId="run-cache")
    second = call(agent, trace, runId="run-cache")
    assert first["ok"] is True and "cacheHit" not in first
    assert second["ok"] is True and second["cacheHit"] is True
    assert second["result"] == first["result"] == {"token": "a", "executions": 1}
    assert runs(trace) == 1
    assert InvocationRecord.objects.get(pk=second["invocationId"]).cache_hit is True
    results = RunEvent.objects.filter(run_id="run-cache", type="tool_call_result").order_by("seq")
    assert [event.message.get("cacheHit") for event in results] == [None, True]
    # The same call again through GET: the record says it too.
    shown = agent.client.get(f"/api/v1/invocations/{second['invocationId']}/").json()
    assert shown["cacheHit"] is True


@pytest.mark.django_db
def test_other_arguments_are_a_miss(agent: Agent, cached: Tool, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    call(agent, trace, token="a")
    other = call(agent, trace, token="b")
    assert "cacheHit" not in other and runs(trace) == 2


@pytest.mark.django_db
def test_without_a_ttl_nothing_is_cached(
    agent: Agent, test_tools: list[str], tmp_path: Path
) -> None:
    allow(agent.tenant, TOOL)
    trace = tmp_path / "trace"
    call(agent, trace)
    again = call(agent, trace)
    assert "cacheHit" not in again and again["result"]["executions"] == 2


@pytest.mark.django_db
def test_a_principal_scoped_entry_is_not_shared_with_another_principal(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    colleague = make_agent("acme", "agent:colleague")
    trace = tmp_path / "trace"
    call(agent, trace)
    assert "cacheHit" not in call(colleague, trace) and runs(trace) == 2
    assert call(colleague, trace)["cacheHit"] is True


@pytest.mark.django_db
def test_a_tenant_scoped_entry_is_shared_in_the_tenant_only(
    agent: Agent, stranger: Agent, cached: Tool, tmp_path: Path
) -> None:
    cached.cache_scope = CacheScope.TENANT
    cached.save()
    allow(stranger.tenant, TOOL)
    colleague = make_agent("acme", "agent:colleague")
    trace = tmp_path / "trace"
    call(agent, trace)
    assert call(colleague, trace)["cacheHit"] is True
    assert "cacheHit" not in call(stranger, trace) and runs(trace) == 2


@pytest.mark.django_db
def test_a_run_scoped_entry_serves_its_run_only(agent: Agent, cached: Tool, tmp_path: Path) -> None:
    cached.cache_scope = CacheScope.RUN
    cached.save()
    trace = tmp_path / "trace"
    call(agent, trace, runId="run-1")
    assert call(agent, trace, runId="run-1")["cacheHit"] is True
    assert "cacheHit" not in call(agent, trace, runId="run-2") and runs(trace) == 2


@pytest.mark.django_db
def test_an_edit_of_the_tool_makes_the_next_call_run(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    call(agent, trace)
    cached.cache_ttl_s = 120
    cached.save()
    assert "cacheHit" not in call(agent, trace) and runs(trace) == 2


@pytest.mark.django_db
def test_an_edit_of_a_policy_rule_makes_the_next_call_run(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    call(agent, trace)
    policy = Policy.objects.get(tenant=agent.tenant, name="allow")
    rule = PolicyRule(
        policy=policy, condition="args.token == 'never'", outcome=Outcome.DENY, tool_pattern=TOOL
    )
    rule.full_clean()
    rule.save()
    assert "cacheHit" not in call(agent, trace) and runs(trace) == 2


@pytest.mark.django_db
def test_an_edit_of_a_connection_makes_the_next_call_run(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    call(agent, trace)
    connection = make_connection(agent.tenant)
    assert call(agent, trace)["result"]["executions"] == 2  # a new connection: an edit
    call(agent, trace)
    connection.allowed_hosts = ["api.example.org"]
    connection.save()
    assert "cacheHit" not in call(agent, trace) and runs(trace) == 3


@pytest.mark.django_db
def test_a_cached_answer_never_passes_a_call_the_policy_now_refuses(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    call(agent, trace)
    policy = Policy.objects.get(tenant=agent.tenant, name="allow")
    policy.tools.remove(cached)
    refused = agent.invoke(TOOL, args={"path": str(trace), "token": "a", "ms": 0}).json()
    assert refused["errorCode"] == "policy_denied" and "cacheHit" not in refused


@pytest.mark.django_db
def test_a_call_that_needs_approval_is_held_though_its_result_is_cached(
    agent: Agent, cached: Tool, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    call(agent, trace)
    policy = Policy.objects.get(tenant=agent.tenant, name="allow")
    rule = PolicyRule(
        policy=policy, condition="true", outcome=Outcome.REQUIRE_APPROVAL, tool_pattern=TOOL
    )
    rule.full_clean()
    rule.save()
    held = agent.invoke(TOOL, args={"path": str(trace), "token": "a", "ms": 0})
    assert held.status_code == 202 and held.json()["status"] == "pending_approval"


@pytest.mark.django_db
def test_a_failed_call_is_not_cached(agent: Agent, cached: Tool, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "trace"  # the tool cannot write: it fails
    first = agent.invoke(TOOL, args={"path": str(missing), "token": "a", "ms": 0}).json()
    assert first["ok"] is False
    missing.parent.mkdir()
    second = call(agent, missing)
    assert "cacheHit" not in second and second["result"]["executions"] == 1


@pytest.mark.django_db
def test_only_read_only_tools_take_a_ttl(test_tools: list[str]) -> None:
    tool = Tool.objects.get(pk="test__confirm")  # external_side_effect
    tool.cache_ttl_s = 30
    with pytest.raises(ValidationError, match="Only read-only tools"):
        tool.full_clean()


@pytest.mark.django_db
def test_metrics_count_hits_and_misses(agent: Agent, cached: Tool, tmp_path: Path) -> None:
    def lookups() -> dict[str, float]:
        with override_settings(TOOLHUB_METRICS_TOKEN=TOKEN):
            response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        return {
            sample.labels["outcome"]: sample.value
            for family in text_string_to_metric_families(response.content.decode())
            if family.name == "toolhub_result_cache_lookups"
            for sample in family.samples
            if sample.labels["tool"] == TOOL and sample.labels["tenant"] == "acme"
        }

    before = lookups()  # the counts are the process's: other tests may have added some
    trace = tmp_path / "trace"
    call(agent, trace)
    call(agent, trace)
    call(agent, trace)
    after = lookups()
    assert after.get("miss", 0) - before.get("miss", 0) == 1
    assert after.get("hit", 0) - before.get("hit", 0) == 2
