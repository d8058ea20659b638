"""The policy evaluator through the HTTP API: deny by default, allowlists, patterns,
approval, precedence, CEL rules, scopes, budgets, and the catalog that comes from the
same decisions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm, remove_perm

from apps.invocations.capabilities import DjangoMailer
from apps.invocations.models import InvocationRecord
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tenants.models import Tenant
from apps.tenants.principals import agents_group, service_user
from apps.tools.contracts import Redaction, ToolContract
from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.conftest import Agent, allow, make_agent
from tests.support import tools as support_tools
from tests.support.responses import failure, ok_result, record_of

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "test__echo"
SLEEP = "test__sleep"
BIG = "test__big_output"
CLOCK = "core__get_current_time"
EMAIL = "core__send_email"


# ---------------------------------------------------------------- helpers


def permit(tenant: Tenant, *tool_ids: str) -> None:
    """`execute_tool` for the tenant's agents, without any policy: the policy decides."""
    group = agents_group(tenant)
    for tool in Tool.objects.filter(pk__in=tool_ids):
        assign_perm("tools.execute_tool", group, tool)


def make_policy(
    tenant: Tenant, name: str, tools: tuple[str, ...] = (), patterns: str = "", **fields: Any
) -> Policy:
    policy = Policy.objects.create(tenant=tenant, name=name, tool_patterns=patterns, **fields)
    policy.tools.add(*Tool.objects.filter(pk__in=tools))
    return policy


def add_rule(policy: Policy, condition: str, outcome: str, tool_pattern: str = "*") -> PolicyRule:
    rule = PolicyRule(
        policy=policy, condition=condition, outcome=outcome, tool_pattern=tool_pattern
    )
    rule.full_clean()
    rule.save()
    return rule


def assert_held(response: Any) -> InvocationRecord:
    """A call that needs a human never runs unapproved: it is held (202 pending_approval)
    or, on a server without approvals, refused as policy_denied naming the approval."""
    body = response.json()
    assert body.get("ok") is not True, body
    assert "result" not in body
    if response.status_code == 202:
        assert body["status"] == "pending_approval", body
    else:
        assert response.status_code == 200, response.content
        assert body["status"] == "failed"
        assert body["errorCode"] == "policy_denied"
        assert "approval" in body["safeMessage"]
    record = record_of(response)
    assert record.result is None
    return record


def catalog_ids(agent: Agent) -> set[str]:
    response = agent.tools()
    assert response.status_code == 200, response.content
    return {spec["id"] for spec in response.json()["tools"]}


def catalog_spec(agent: Agent, tool_id: str) -> dict[str, Any]:
    specs = {spec["id"]: spec for spec in agent.tools().json()["tools"]}
    assert tool_id in specs, sorted(specs)
    return specs[tool_id]


@pytest.fixture
def caller(bare_agent: Agent, test_tools: list[str]) -> Agent:
    """Tenant `initech`'s agent: may execute every test tool and the clock, but no policy yet."""
    permit(bare_agent.tenant, *test_tools, CLOCK, EMAIL)
    return bare_agent


# ---------------------------------------------------------------- deny by default, allowlists


def test_a_tenant_without_any_policy_is_denied_by_default(caller):
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, message = failure(response)
    assert code == "policy_denied"
    assert message == f"No policy of this tenant allows {ECHO}."
    assert record_of(response).policy_rule == "default:deny"


def test_an_explicit_allowlist_allows_exactly_the_tools_it_names(caller):
    policy = make_policy(caller.tenant, "echo only", tools=(ECHO,))
    response = caller.invoke(ECHO, args={"text": "hi"})
    assert ok_result(response) == {"text": "hi"}
    assert record_of(response).policy_rule == policy.label
    code, _ = failure(caller.invoke("test__refuse", args={}))
    assert code == "policy_denied"
    assert catalog_ids(caller) == {ECHO}


def test_an_id_pattern_allows_the_enabled_tools_it_matches_and_no_others(caller, test_tools):
    make_policy(caller.tenant, "test tools", patterns="test__*")
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    code, _ = failure(caller.invoke(CLOCK, args={}))
    assert code == "policy_denied"
    listed = catalog_ids(caller)
    assert CLOCK not in listed
    assert listed == set(test_tools)


@pytest.mark.parametrize("how", ["pattern", "explicit"])
def test_a_disabled_tool_stays_refused_and_unlisted_whatever_the_policy_says(caller, how):
    if how == "pattern":
        make_policy(caller.tenant, "test tools", patterns="test__*")
    else:
        make_policy(caller.tenant, "echo", tools=(ECHO,))
    Tool.objects.filter(pk=ECHO).update(enabled=False)
    code, message = failure(caller.invoke(ECHO, args={"text": "hi"}))
    assert code == "unavailable"
    assert "disabled" in message
    assert ECHO not in catalog_ids(caller)


@pytest.fixture
def fresh_tool(test_tools: list[str]) -> Iterator[str]:
    """A tool that appeared after the policy was written and that staff never enabled."""
    contract = ToolContract(
        name="fresh",
        description="A tool staff have not enabled yet.",
        params=support_tools.NoParams,
        result=support_tools.Waited,
        execute=support_tools.noop,
        effect="read_only",
        redaction=Redaction(result=("waited",), args=()),
        namespace="test",
    )
    registered = registry.register(contract)
    try:
        tool = Tool(id=registered.id, enabled=False)
        tool.apply_contract(registered)
        tool.save()
        yield registered.id
    finally:
        registry.unregister(registered.id)


def test_an_id_pattern_never_allows_a_tool_that_is_not_yet_enabled(caller, fresh_tool):
    make_policy(caller.tenant, "test tools", patterns="test__*")
    permit(caller.tenant, fresh_tool)
    code, _ = failure(caller.invoke(fresh_tool, args={}))
    assert code == "unavailable"
    listed = catalog_ids(caller)
    assert fresh_tool not in listed
    assert ECHO in listed


# ---------------------------------------------------------------- approval


def test_approval_effects_hold_the_call_and_the_catalog_says_it_needs_approval(caller):
    policy = make_policy(
        caller.tenant, "echo with approval", tools=(ECHO,), approval_effects=["read_only"]
    )
    record = assert_held(caller.invoke(ECHO, args={"text": "hi"}))
    assert record.policy_rule == policy.label
    assert catalog_spec(caller, ECHO)["requiresApproval"] is True


def test_a_policy_without_approval_effects_lists_the_tool_without_approval(caller):
    make_policy(caller.tenant, "echo", tools=(ECHO,), approval_effects=["external_side_effect"])
    assert catalog_spec(caller, ECHO)["requiresApproval"] is False
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}


def test_sending_email_through_the_api_is_held_and_nothing_is_sent(caller, mailoutbox):
    make_policy(caller.tenant, "email", tools=(EMAIL,))
    assert catalog_spec(caller, EMAIL)["requiresApproval"] is True
    response = caller.invoke(
        EMAIL, args={"to": ["someone@example.com"], "subject": "Hello", "body": "Hi there"}
    )
    assert_held(response)
    # Operators may be notified by mail; the tool's own email must not have gone out.
    tools_mail = [m for m in mail.outbox if "someone@example.com" in m.to]
    assert tools_mail == []
    assert all(m.subject != "Hello" for m in mailoutbox)


def test_the_mail_capability_sends_through_djangos_mail_framework(mailoutbox):
    sent = DjangoMailer().send(["a@example.com", "b@example.com"], "Subject line", "The body")
    assert sent == 1
    assert len(mailoutbox) == 1
    message = mailoutbox[0]
    assert message.to == ["a@example.com", "b@example.com"]
    assert message.subject == "Subject line"
    assert message.body == "The body"


# ---------------------------------------------------------------- precedence


def test_a_deny_rule_beats_an_allow_policy(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,))
    rule = add_rule(policy, "true", Outcome.DENY, tool_pattern=ECHO)
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, _ = failure(response)
    assert code == "policy_denied"
    assert record_of(response).policy_rule == rule.label


def test_a_deny_rule_in_another_policy_still_beats_the_allow(caller):
    make_policy(caller.tenant, "echo", tools=(ECHO,))
    guard = make_policy(caller.tenant, "guard rails")
    rule = add_rule(guard, 'args.text.contains("drop")', Outcome.DENY, tool_pattern="test__*")
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    response = caller.invoke(ECHO, args={"text": "drop table"})
    code, _ = failure(response)
    assert code == "policy_denied"
    assert record_of(response).policy_rule == rule.label


def test_require_approval_from_one_policy_beats_an_allow_from_another(caller):
    make_policy(caller.tenant, "echo", tools=(ECHO,))
    strict = make_policy(caller.tenant, "strict", tools=(ECHO,), approval_effects=["read_only"])
    record = assert_held(caller.invoke(ECHO, args={"text": "hi"}))
    assert record.policy_rule == strict.label
    assert catalog_spec(caller, ECHO)["requiresApproval"] is True


def test_a_require_approval_rule_beats_the_allow(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,))
    rule = add_rule(policy, "true", Outcome.REQUIRE_APPROVAL, tool_pattern=ECHO)
    record = assert_held(caller.invoke(ECHO, args={"text": "hi"}))
    assert record.policy_rule == rule.label


def test_deny_beats_require_approval(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,), approval_effects=["read_only"])
    rule = add_rule(policy, "true", Outcome.DENY, tool_pattern=ECHO)
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, message = failure(response)
    assert code == "policy_denied"
    assert "approval" not in message
    assert record_of(response).policy_rule == rule.label


def test_an_allow_rule_alone_does_not_override_a_deny_rule(caller):
    policy = make_policy(caller.tenant, "rules only")
    add_rule(policy, "true", Outcome.ALLOW, tool_pattern=ECHO)
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    deny = add_rule(policy, 'args.text == "no"', Outcome.DENY, tool_pattern=ECHO)
    response = caller.invoke(ECHO, args={"text": "no"})
    code, _ = failure(response)
    assert code == "policy_denied"
    assert record_of(response).policy_rule == deny.label


# ---------------------------------------------------------------- CEL rules


def test_a_cel_rule_denies_long_texts_and_allows_short_ones(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,))
    rule = add_rule(policy, "args.text.size() > 5", Outcome.DENY, tool_pattern=ECHO)
    assert ok_result(caller.invoke(ECHO, args={"text": "short"})) == {"text": "short"}
    response = caller.invoke(ECHO, args={"text": "much too long"})
    code, message = failure(response)
    assert code == "policy_denied"
    assert "args.text.size() > 5" in message
    recorded = record_of(response).policy_rule
    assert "rule:" in recorded
    assert recorded == rule.label


def test_a_rule_only_applies_to_the_tools_its_pattern_matches(caller):
    policy = make_policy(caller.tenant, "echo and sleep", tools=(ECHO, SLEEP))
    add_rule(policy, "true", Outcome.DENY, tool_pattern=SLEEP)
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    code, _ = failure(caller.invoke(SLEEP, args={"seconds": 0}))
    assert code == "policy_denied"


def test_a_threshold_rule_requires_approval_above_the_amount(caller):
    policy = make_policy(caller.tenant, "sleep", tools=(SLEEP,))
    rule = add_rule(policy, "args.seconds > 0.2", Outcome.REQUIRE_APPROVAL, tool_pattern=SLEEP)
    assert ok_result(caller.invoke(SLEEP, args={"seconds": 0.1})) == {"waited": 0}
    started = time.monotonic()
    record = assert_held(caller.invoke(SLEEP, args={"seconds": 0.4}))
    assert record.policy_rule == rule.label
    assert time.monotonic() - started < 0.35  # held before it ran, not after sleeping


def test_a_rule_that_fails_at_runtime_denies_and_records_why(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,))
    rule = add_rule(policy, "args.missing_field > 1", Outcome.ALLOW, tool_pattern=ECHO)
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, message = failure(response)
    assert code == "policy_denied"
    assert "could not be evaluated" in message
    record = record_of(response)
    assert record.policy_rule == rule.label
    assert record.safe_message == message


def test_a_rule_that_returns_a_non_boolean_denies(caller):
    policy = make_policy(caller.tenant, "echo", tools=(ECHO,))
    add_rule(policy, "args.text", Outcome.DENY, tool_pattern=ECHO)
    code, message = failure(caller.invoke(ECHO, args={"text": "hi"}))
    assert code == "policy_denied"
    assert "true or false" in message


# ---------------------------------------------------------------- who a policy applies to


def test_a_group_scoped_policy_applies_only_to_members_of_the_group(caller):
    outsider = make_agent(caller.tenant.slug, "agent:outsider")
    reviewers = Group.objects.create(name="initech: reviewers")
    service_user(caller.tenant, caller.principal).groups.add(reviewers)
    make_policy(caller.tenant, "reviewers may echo", tools=(ECHO,), group=reviewers)

    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    code, _ = failure(outsider.invoke(ECHO, args={"text": "hi"}))
    assert code == "policy_denied"
    assert catalog_ids(caller) == {ECHO}
    assert catalog_ids(outsider) == set()


def test_a_principal_scoped_policy_applies_only_to_that_principal(caller):
    other = make_agent(caller.tenant.slug, "agent:other")
    make_policy(caller.tenant, "lonely may echo", tools=(ECHO,), principal=caller.principal)

    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
    code, message = failure(other.invoke(ECHO, args={"text": "hi"}))
    assert code == "policy_denied"
    assert message == f"No policy of this tenant allows {ECHO}."
    assert catalog_ids(caller) == {ECHO}
    assert catalog_ids(other) == set()


def test_a_policy_of_another_tenant_never_applies(caller, stranger):
    allow(stranger.tenant, ECHO, name="globex echo")
    code, _ = failure(caller.invoke(ECHO, args={"text": "hi"}))
    assert code == "policy_denied"


def test_a_disabled_policy_allows_nothing(caller):
    make_policy(caller.tenant, "off", tools=(ECHO,), patterns="test__*", enabled=False)
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, _ = failure(response)
    assert code == "policy_denied"
    assert record_of(response).policy_rule == "default:deny"
    assert catalog_ids(caller) == set()


# ---------------------------------------------------------------- budgets


def test_a_runtime_budget_times_the_call_out_within_the_budget(caller):
    make_policy(caller.tenant, "sleep", tools=(SLEEP,), max_runtime_ms=100)
    started = time.monotonic()
    response = caller.invoke(SLEEP, args={"seconds": 0.5})
    elapsed = time.monotonic() - started
    code, message = failure(response)
    assert code == "timeout"
    assert "0.1 s" in message
    assert elapsed < 0.45  # the tool's own timeout is 0.5 s: the budget cut it shorter


def test_the_tightest_runtime_budget_of_the_admitting_policies_wins(caller):
    make_policy(caller.tenant, "loose", tools=(SLEEP,), max_runtime_ms=400)
    make_policy(caller.tenant, "tight", tools=(SLEEP,), max_runtime_ms=100)
    code, message = failure(caller.invoke(SLEEP, args={"seconds": 0.3}))
    assert code == "timeout"
    assert "0.1 s" in message


def test_a_result_size_budget_refuses_a_larger_result(caller):
    make_policy(caller.tenant, "big", tools=(BIG,), max_result_bytes=500)
    code, message = failure(caller.invoke(BIG, args={"size": 1000}))
    assert code == "result_too_large"
    assert "500" in message
    assert ok_result(caller.invoke(BIG, args={"size": 100})) == {"blob": "x" * 100}


def test_a_rate_budget_refuses_the_third_call_in_a_minute(caller):
    make_policy(caller.tenant, "echo", tools=(ECHO,), calls_per_minute=2)
    assert ok_result(caller.invoke(ECHO, args={"text": "1"})) == {"text": "1"}
    assert ok_result(caller.invoke(ECHO, args={"text": "2"})) == {"text": "2"}
    code, message = failure(caller.invoke(ECHO, args={"text": "3"}))
    assert code == "rate_limited"
    assert "2 calls per minute" in message


def test_a_rate_budget_counts_each_principal_separately(caller):
    other = make_agent(caller.tenant.slug, "agent:other")
    make_policy(caller.tenant, "echo", tools=(ECHO,), calls_per_minute=1)
    assert ok_result(caller.invoke(ECHO, args={"text": "1"})) == {"text": "1"}
    assert ok_result(other.invoke(ECHO, args={"text": "1"})) == {"text": "1"}
    code, _ = failure(caller.invoke(ECHO, args={"text": "2"}))
    assert code == "rate_limited"


# ---------------------------------------------------------------- the catalog


def test_denied_tools_never_appear_in_the_catalog(caller):
    make_policy(caller.tenant, "echo", tools=(ECHO,))
    listed = catalog_ids(caller)
    assert listed == {ECHO}
    for fmt, key in (("openai", "function"), ("anthropic", None)):
        tools = caller.tools(format=fmt).json()["tools"]
        names = {t[key]["name"] if key else t["name"] for t in tools}
        assert names == {ECHO}


VALID_ARGS: dict[str, dict[str, Any]] = {
    ECHO: {"text": "hi"},
    SLEEP: {"seconds": 0},
    BIG: {"size": 1},
    "test__refuse": {},
    "test__crash": {},
    "test__wrong_output": {},
    CLOCK: {},
}


def test_the_catalog_and_the_runner_evaluate_the_same_policies(caller):
    reviewers = Group.objects.create(name="initech: reviewers")
    service_user(caller.tenant, caller.principal).groups.add(reviewers)
    make_policy(caller.tenant, "explicit", tools=(ECHO,))
    make_policy(caller.tenant, "pattern", patterns="test__s*")
    make_policy(caller.tenant, "group", tools=(BIG,), group=reviewers)
    make_policy(caller.tenant, "someone else", tools=("test__refuse",), principal="agent:x")
    make_policy(caller.tenant, "off", tools=("test__crash",), enabled=False)
    rules = make_policy(caller.tenant, "rules")
    add_rule(rules, "true", Outcome.ALLOW, tool_pattern=CLOCK)

    listed = catalog_ids(caller)
    assert listed == {ECHO, SLEEP, BIG, CLOCK}
    for tool_id, args in VALID_ARGS.items():
        body = caller.invoke(tool_id, args=args).json()
        admitted = body.get("errorCode") != "policy_denied"
        assert admitted == (tool_id in listed), (tool_id, body)


def test_without_execute_tool_the_catalog_is_empty_with_a_notice(agent):
    group = agents_group(agent.tenant)
    for tool in Tool.objects.all():
        remove_perm("tools.execute_tool", group, tool)
    body = agent.tools().json()
    assert body["tools"] == []
    assert "execute_tool" in body["notice"]
    assert agent.principal in body["notice"]


def test_without_execute_tool_invoking_is_authz_denied(agent):
    group = agents_group(agent.tenant)
    remove_perm("tools.execute_tool", group, Tool.objects.get(pk=CLOCK))
    code, message = failure(agent.invoke(CLOCK, args={}))
    assert code == "authz_denied"
    assert agent.principal in message


def test_a_catalog_with_tools_has_no_notice(agent):
    body = agent.tools().json()
    assert body["tools"]
    assert "notice" not in body


def count_catalog_queries(agent: Agent) -> int:
    agent.tools()  # warm up anything done once (key touch, content types)
    with CaptureQueriesContext(connection) as queries:
        response = agent.tools()
    assert response.status_code == 200
    return len(queries.captured_queries)


def test_the_catalog_takes_the_same_number_of_queries_for_2_and_6_tools(bare_agent, test_tools):
    six = [ECHO, SLEEP, BIG, "test__refuse", "test__crash", CLOCK]
    policy = allow(bare_agent.tenant, *six)  # policy and execute_tool, tool by tool
    add_rule(policy, "true", Outcome.DENY, tool_pattern="test__crash")  # rules cost nothing
    Tool.objects.exclude(pk__in=six[:2]).update(enabled=False)
    assert catalog_ids(bare_agent) == set(six[:2])
    with_two = count_catalog_queries(bare_agent)

    Tool.objects.filter(pk__in=six).update(enabled=True)
    assert catalog_ids(bare_agent) == set(six)
    with_six = count_catalog_queries(bare_agent)
    assert with_six == with_two
