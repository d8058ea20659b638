"""Every condition has a bounded cost (RULES_HAVE_A_BOUNDED_COST): refused when saved if
it is too expensive, and checked again at each call against the arguments it reads.

The library holds Python's lock for a whole evaluation: five nested comprehensions over
20-element literals took 6.8 s a call and stalled every tenant (apps/policies/cost.py).
"""

from __future__ import annotations

import pytest

from apps.invocations.requests import MAX_ARGS_BYTES
from apps.policies import cost
from apps.policies.conditions import ConditionError, compile_condition, holds
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.policies.syntax import tokens
from apps.tenants.principals import agents_group
from tests.conftest import Agent
from tests.support.responses import failure, ok_result, record_of

pytestmark = pytest.mark.one_leg

ECHO = "test__echo"
TWENTY = "[" + ",".join(str(i) for i in range(20)) + "]"
CALL = {
    "args": {"text": "hello", "to": ["a@example.com", "b@example.com"], "amount": 120},
    "tool": {"id": ECHO, "effect": "read_only", "consequenceLevel": "low"},
    "principal": "agent:test",
    "runId": "run-1",
}


def nested(levels: int, over: str = TWENTY) -> str:
    """The issue's rule: `levels` comprehensions over `over`, innermost `false` (no short cut)."""
    condition = "false"
    for level in reversed(range(levels)):
        condition = f"{over}.exists(v{level}, {condition})"
    return condition


def refusal(condition: str) -> str:
    with pytest.raises(ConditionError) as caught:
        compile_condition(condition)
    return str(caught.value)


def literal(items: int) -> str:
    return "[" + ",".join(str(i % 10) for i in range(items)) + "]"


# ---------------------------------------------------------------- refused at save


def test_it_refuses_five_nested_comprehensions_over_literals():
    condition = nested(5)
    assert 300 < len(condition) < 2000  # the 326 characters, give or take spaces
    message = refusal(condition)
    assert message.startswith("The condition is too expensive: exists() at column")
    assert "runs its body 20 times" in message
    assert f"the limit is {cost.LIMIT:,}" in message


def test_it_refuses_six_nested_comprehensions_over_literals():
    assert "too expensive" in refusal(nested(6))


def test_it_refuses_three_nested_comprehensions_that_would_take_milliseconds():
    message = refusal(nested(3))
    column = message.split("at column ")[1].split(" ")[0]
    assert nested(3)[int(column) - 1 :].startswith("exists(v0")  # the outermost: 20 by 20 by 20


def test_it_refuses_a_comprehension_over_a_huge_list_literal_with_a_costly_body():
    message = refusal(f"{literal(600)}.exists(a, {literal(300)}.exists(b, a == b))")
    assert "runs its body 600 times" in message


def test_it_refuses_a_huge_list_built_from_small_literals():
    message = refusal(f"size({literal(40)}.map(a, {literal(40)}.map(b, {literal(40)}))) > 0")
    assert "too expensive" in message
    assert "map() at column" in message


def test_it_refuses_map_and_filter_over_long_literals_whose_cost_is_quadratic():
    assert "map() at column" in refusal(f"size({literal(300)}.map(x, x)) > 0")
    assert "filter() at column" in refusal(f"size({literal(300)}.filter(x, true)) > 0")


def test_it_refuses_nested_comprehensions_over_the_calls_arguments():
    message = refusal("args.to.exists(x, args.cc.exists(y, x == y))")
    assert "exists() at column 9 costs more with the square of the call's arguments" in message


def test_it_refuses_a_string_operation_on_the_arguments_in_a_loop_over_them():
    message = refusal("args.to.exists(x, args.text.contains(x))")
    assert "square of the call's arguments" in message


def test_it_refuses_map_over_the_arguments_because_the_library_copies_its_result():
    message = refusal("size(args.to.map(x, x)) > 0")
    assert "map() copies its result list at every turn" in message


def test_it_refuses_string_concatenation_that_grows_with_the_arguments():
    condition = " + ".join(["args.text"] * 60) + ' == "x"'
    message = refusal(condition)
    assert "steps per character of the call's arguments" in message


def test_it_refuses_long_literal_strings_concatenated_in_a_long_loop():
    piece = '"' + "a" * 200 + '"'
    condition = f"{literal(600)}.exists(i, ({piece} + {piece} + {piece}).contains(args.text))"
    assert "too expensive" in refusal(condition)


@pytest.mark.parametrize(
    "pattern",
    [r"(\\w{100}){10}", r"\\w{20}", r"\\pL\\pL\\pL\\pL", r"(?i)\\w\\w\\w\\w", r".{1000}"],
)
def test_it_refuses_patterns_that_take_milliseconds_to_compile(pattern):
    message = refusal(f'args.text.matches("{pattern}")')
    assert "matches() at column 11 costs about" in message


def test_it_refuses_a_pattern_compiled_at_every_turn_of_a_loop_over_the_arguments():
    message = refusal('args.to.exists(x, x.matches("^\\\\w+@example[.]com$"))')
    assert "steps per value" in message


def test_it_refuses_a_pattern_that_is_not_written_in_the_condition():
    message = refusal("args.text.matches(args.to[0])")
    assert "needs its pattern written as a string" in message


def test_it_refuses_what_its_cost_check_cannot_read():
    assert "lowerAscii() at column" in refusal('args.text.lowerAscii() == "x"')
    assert "'secret' at column 1 is not a variable" in refusal("secret == 1")
    assert "message literals" in refusal("google.protobuf.Int32Value{value: 1} == 1")
    assert "class set operation" in refusal('args.text.matches("[a-z&&[^aeiou]]")')


# ---------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    "condition",
    [
        "true",
        "false",
        "args.amount > 100",
        "args.seconds > 0.2",
        'args.text.contains("drop")',
        'args.text == "no"',
        "args.text.size() > 5",
        "args.text",
        "args.missing_field > 1",
        'args.timezone == "Europe/Paris"',
        "args.timezone.startsWith('America/')",
        'args.token == "d1"',
        'args.text.startsWith("pay")',
        'args.text == "forbidden"',
        '!args.url.startsWith("https://api.example.com/")',
        'principal == "agent:ops"',
        "has(args.cc) && size(args.cc) > 0",
        'tool.effect == "external_side_effect" && tool.consequenceLevel == "high"',
        'args.to.exists(x, x.endsWith("@evil.example"))',
        'args.to.all(x, x.matches("^[a-z.]+@example[.]com$"))',
        'runId.startsWith("nightly-") ? args.amount < 10 : args.amount < 1000',
        'type(args.amount) == int && args.amount in [1, 2, 3] && "to" in args',
    ],
)
def test_every_condition_the_tests_docs_and_help_texts_use_is_accepted(condition):
    assert compile_condition(condition).cost.worst() >= 0


def accepted(condition: str) -> bool:
    try:
        compile_condition(condition)
    except ConditionError:
        return False
    return True


def test_a_rule_right_under_the_cap_is_accepted_and_evaluated():
    largest = max(k for k in range(10, 100) if accepted(nested(2, over=literal(k))))
    assert not accepted(nested(2, over=literal(largest + 1)))
    condition = nested(2, over=literal(largest))
    assert 0.9 * cost.LIMIT < compile_condition(condition).cost.worst() <= cost.LIMIT
    assert holds(condition, CALL) is False


def test_patterns_that_backtrack_elsewhere_are_accepted_with_a_linear_cost():
    # Rust's regex never backtracks: matching is linear in the text, only compiling costs.
    condition = 'args.text.matches("^(a+)+$") || args.text.matches("^(a|aa)*c$")'
    accepted = compile_condition(condition).cost.static()
    assert accepted.degree() == 1
    assert accepted.per(cost.C) <= cost.PER_CHAR_LIMIT
    assert holds(condition, {"args": {"text": "a" * 4000 + "b"}}) is False


def test_the_cost_check_reads_every_kind_of_literal():
    condition = (
        'b"\\x00\\377é".size() == 4 && r"\\n".size() == 2 && """two\nlines""".size() == 9 '
        "&& '''x'''.size() == 1 && 1u < 0x10u && -1.5e3 < .5 && 0xFF == 255 && null == null "
        "&& {1: [true], 'k': {}}.size() == 2 && [1, 2,].size() == 2 // a comment"
    )
    assert holds(condition, CALL) is True
    kinds = ("bytes", "string", "uint", "double")
    values = [token.value for token in tokens(condition) if token.kind in kinds]
    assert values == [b"\x00\xff\xc3\xa9", "\\n", "two\nlines", "x", 1, 16, 1500.0, 0.5, "k"]


def test_the_arguments_bound_is_the_runners():
    assert cost.ARGS_BYTES == MAX_ARGS_BYTES


# ---------------------------------------------------------------- at every call


def test_the_library_is_handed_only_what_the_condition_reads():
    condition = compile_condition("has(args.cc) && args.to.size() > 1 && args.meta.level > 2")
    call = {**CALL, "args": {"to": ["x"], "cc": ["a"] * 100, "meta": {"level": 3, "blob": "b"}}}
    assert condition.cost.variables(call) == {
        "args": {"to": ["x"], "cc": None, "meta": {"level": 3}}
    }
    assert compile_condition("true").cost.variables(call) == {}


def test_the_library_gets_the_same_answers_from_what_it_is_handed():
    call = {**CALL, "args": {"to": [], "meta": {"level": 1, "blob": "b" * 100}}}
    presence = "has(args.meta.level) && !has(args.meta.other) && !has(args.cc)"
    assert compile_condition(presence).cost.variables(call) == {"args": {"meta": {"level": None}}}
    assert holds(presence, call) is True
    with pytest.raises(ConditionError, match="no field 'cc'"):
        holds("args.cc.size() > 0", call)


def test_arguments_too_large_for_a_rule_fail_closed_at_the_call():
    condition = 'args.to.exists(x, x == "nobody@example.com")'
    assert holds(condition, CALL) is False
    many = {**CALL, "args": {"to": ["someone@example.com"] * 2000}}
    with pytest.raises(ConditionError) as caught:
        holds(condition, many)
    assert "too expensive for this call" in str(caught.value)
    assert "the parts of them it reads (at least" in str(caught.value)


def test_a_rule_that_does_not_read_the_arguments_is_not_handed_them_whatever_their_size():
    many = {**CALL, "args": {"to": [[]] * 4000}}
    condition = 'principal == "agent:test"'
    assert compile_condition(condition).cost.variables(many) == {"principal": "agent:test"}
    assert holds(condition, many) is True


# ---------------------------------------------------------------- through the API


@pytest.fixture
def caller(bare_agent: Agent, test_tools: list[str]) -> Agent:
    from guardian.shortcuts import assign_perm

    from apps.tools.models import Tool

    assign_perm("tools.execute_tool", agents_group(bare_agent.tenant), Tool.objects.get(pk=ECHO))
    policy = Policy.objects.create(tenant=bare_agent.tenant, name="echo")
    policy.tools.add(Tool.objects.get(pk=ECHO))
    return bare_agent


@pytest.mark.django_db(transaction=True)
def test_an_over_budget_rule_already_in_the_database_denies_the_call_and_says_why(caller):
    policy = Policy.objects.get(tenant=caller.tenant, name="echo")
    rule = PolicyRule.objects.create(  # saved before costs were bounded: no clean()
        policy=policy, condition=nested(5), outcome=Outcome.DENY, tool_pattern=ECHO
    )
    response = caller.invoke(ECHO, args={"text": "hi"})
    code, message = failure(response)
    assert code == "policy_denied"
    assert "could not be evaluated" in message
    assert "too expensive: exists() at column" in message
    assert record_of(response).policy_rule == rule.label


@pytest.mark.django_db(transaction=True)
def test_a_call_whose_arguments_are_too_large_for_a_rule_is_denied_and_a_small_one_is_not(
    caller,
):
    policy = Policy.objects.get(tenant=caller.tenant, name="echo")
    rule = PolicyRule(
        policy=policy,
        condition='args.text.matches("\\\\b(drop|delete)\\\\b")',
        outcome=Outcome.DENY,
        tool_pattern=ECHO,
    )
    rule.full_clean()
    rule.save()
    assert ok_result(caller.invoke(ECHO, args={"text": "hello"})) == {"text": "hello"}
    code, message = failure(caller.invoke(ECHO, args={"text": "hello " * 1300}))
    assert code == "policy_denied"
    assert "too expensive for this call: the call's arguments are too large" in message


@pytest.mark.django_db(transaction=True)
def test_many_rules_each_under_the_cap_cannot_together_hold_a_call_past_its_budget(caller):
    """Each rule is bounded when saved; a tenant admin who saves many of them still cannot
    make one call hold the interpreter past cost.CALL_LIMIT: the call is denied instead."""
    from apps.policies.cost import CALL_LIMIT, analyse

    policy = Policy.objects.get(tenant=caller.tenant, name="echo")
    costly = nested(2, "[" + ",".join(str(i) for i in range(40)) + "]")
    each = analyse(costly).worst()
    assert each < CALL_LIMIT < 3 * each
    for _ in range(3):
        rule = PolicyRule(policy=policy, condition=costly, outcome=Outcome.DENY, tool_pattern=ECHO)
        rule.full_clean()  # each one is accepted
        rule.save()
    code, message = failure(caller.invoke(ECHO, args={"text": "hi"}))
    assert code == "policy_denied"
    assert "would together take more than" in message
    # Two of them fit in the budget: the call goes on (the rules do not hold).
    PolicyRule.objects.filter(policy=policy, condition=costly).first().delete()
    assert ok_result(caller.invoke(ECHO, args={"text": "hi"})) == {"text": "hi"}
