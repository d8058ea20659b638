"""Hooks (apps/invocations/hooks): settings.TOOLHUB_HOOKS, run by the runner at their
stages, recorded on the record, unable to widen what the checks allow; a hook that
raises, loops, answers or changes a result the schema refuses ends the call with an
error that names it; a hook path that does not load fails the system check.

The misbehaving hooks are in tests/support/hooks.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.invocations import checks, runner
from apps.invocations.hooks.business_hours import BusinessHours
from apps.invocations.models import InvocationRecord
from apps.policies.models import Outcome, Policy
from tests.approvals.support import add_rule, drain_queue, make_operator
from tests.conftest import Agent, allow
from tests.support import hooks as test_hooks

ECHO = "test__echo"
COUNTED = "test__counted_wait"
H = "tests.support.hooks."


def hooked(*entries: Any) -> Any:
    return override_settings(TOOLHUB_HOOKS=[H + e if isinstance(e, str) else e for e in entries])


@pytest.fixture
def caller(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, ECHO, COUNTED, "test__wrong_output", "test__crash")
    return agent


@pytest.fixture
def loose() -> Iterator[None]:
    test_hooks.RELEASE.clear()
    yield
    test_hooks.RELEASE.set()  # the looping hook's thread ends


def echo(agent: Agent, text: str = "hi", **body: Any) -> dict[str, Any]:
    data: dict[str, Any] = agent.invoke(ECHO, args={"text": text}, **body).json()
    return data


def counted(agent: Agent, trace: Path) -> dict[str, Any]:
    args = {"path": str(trace), "token": "t", "ms": 0}
    data: dict[str, Any] = agent.invoke(COUNTED, args=args).json()
    return data


# ---------------------------------------------------------------- what a hook may do


@pytest.mark.django_db
def test_a_hook_changes_the_arguments_which_are_validated_and_recorded(caller: Agent) -> None:
    with hooked("Shouts"):
        body = echo(caller, "quiet please")
    assert body["ok"] is True and body["result"] == {"text": "QUIET PLEASE"}
    assert body["args"] == {"text": "QUIET PLEASE"}
    assert body["hooks"] == [
        {"hook": H + "Shouts", "stage": "after_validation", "did": "changed the arguments"}
    ]


@pytest.mark.django_db
def test_arguments_a_hook_breaks_are_refused_naming_the_hook(caller: Agent) -> None:
    with hooked("Breaks"):
        body = echo(caller)
    assert body["errorCode"] == "validation"
    assert f"The arguments the hook {H}Breaks set are refused" in body["safeMessage"]


@pytest.mark.django_db
def test_a_hook_answers_in_the_tools_place(caller: Agent, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with hooked("Answers"):
        body = counted(caller, trace)
    assert body["ok"] is True and body["result"] == {"token": "from-hook", "executions": 0}
    assert not trace.exists()  # the tool did not run
    assert body["hooks"][0]["did"] == "answered in the tool's place"


@pytest.mark.django_db
def test_a_hook_aborts_with_an_error_code_and_is_named(caller: Agent, tmp_path: Path) -> None:
    entry = {"hook": H + "Aborts", "options": {"code": "policy_denied"}}
    with hooked(entry):
        body = echo(caller)
    assert body["errorCode"] == "policy_denied"
    assert body["safeMessage"] == (
        f"Amounts over 100 need a purchase order. (refused by the hook {H}Aborts)"
    )
    assert body["hooks"] == [
        {"hook": H + "Aborts", "stage": "after_validation", "did": "aborted: policy_denied"}
    ]


@pytest.mark.django_db
def test_an_abort_with_a_code_that_is_not_an_error_code_is_an_execution_error(
    caller: Agent,
) -> None:
    with hooked({"hook": H + "Aborts", "options": {"code": "nope"}}):
        body = echo(caller)
    assert body["errorCode"] == "execution"
    assert (
        f"The hook {H}Aborts aborted with 'nope', which is not an error code"
        in (body["safeMessage"])
    )


@pytest.mark.django_db
def test_hooks_run_by_priority_then_in_the_order_listed(caller: Agent) -> None:
    entries = [
        {"hook": H + "Names", "options": {"name": "a"}},
        {"hook": H + "Names", "options": {"name": "b"}, "priority": 5},
        {"hook": H + "Names", "options": {"name": "c"}},
    ]
    with override_settings(TOOLHUB_HOOKS=entries):
        body = echo(caller, "x")
    assert body["result"] == {"text": "x-b-a-c"}


@pytest.mark.django_db
def test_filters_choose_the_calls_a_hook_sees(caller: Agent, stranger: Agent) -> None:
    allow(stranger.tenant, ECHO)
    for entry, shouted in [
        ({"tools": ["test__e*"]}, True),
        ({"tools": ["core__*"]}, False),
        ({"effects": ["read_only"]}, True),
        ({"effects": ["state_change"]}, False),
        ({"tenants": ["acme"]}, True),
        ({"tenants": ["globex"]}, False),
        ({"sources": ["core"]}, True),
        ({"sources": ["mcp"]}, False),
    ]:
        with override_settings(TOOLHUB_HOOKS=[{"hook": H + "Shouts", **entry}]):
            body = echo(caller, "hi")
        assert body["result"]["text"] == ("HI" if shouted else "hi"), entry
    with override_settings(TOOLHUB_HOOKS=[{"hook": H + "Shouts", "tenants": ["acme"]}]):
        assert echo(stranger, "hi")["result"]["text"] == "hi"


@pytest.mark.django_db
def test_on_error_hooks_see_the_error_and_change_nothing(caller: Agent) -> None:
    test_hooks.SEEN.clear()
    with hooked("Watches"):
        body = caller.invoke("test__crash").json()
    assert body["errorCode"] == "execution"
    assert test_hooks.SEEN == [{"tool": "test__crash", "code": "execution", "stage": "on_error"}]
    assert body["hooks"] == [{"hook": H + "Watches", "stage": "on_error", "did": "saw the error"}]


# ---------------------------------------------------------------- no way around the checks


@pytest.mark.django_db
def test_a_hook_cannot_answer_before_the_policy(caller: Agent, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with hooked("AnswersEarly"):
        body = counted(caller, trace)
    assert body["ok"] is False and body["errorCode"] == "execution"
    assert (
        f"The hook {H}AnswersEarly tried to answer at before_authorization" in (body["safeMessage"])
    )
    assert not trace.exists()


@pytest.mark.django_db
def test_a_refused_call_stays_refused_whatever_a_hook_does(
    bare_agent: Agent, test_tools: list[str], tmp_path: Path
) -> None:
    with hooked("Answers"):  # it would answer, but the call never reaches it
        body = counted(bare_agent, tmp_path / "trace")
    assert body["errorCode"] == "policy_denied" and "hooks" not in body


@pytest.mark.django_db
def test_changing_the_arguments_after_the_checks_is_refused(caller: Agent) -> None:
    with hooked("ChangesLate"):
        body = echo(caller)
    assert body["errorCode"] == "policy_denied"
    assert (
        f"The hook {H}ChangesLate changed the arguments at before_execution"
        in (body["safeMessage"])
    )


@pytest.mark.django_db
def test_an_approval_binds_the_arguments_hooks_set_and_a_hook_that_changes_them_after_it_is_refused(
    caller: Agent,
) -> None:
    policy = Policy.objects.get(tenant=caller.tenant, name="allow")
    add_rule(policy, "true", Outcome.REQUIRE_APPROVAL, tool_pattern=ECHO)
    operator = make_operator("olga", caller.tenant)

    def held_then_run(hook: str) -> InvocationRecord:
        with hooked(hook):
            response = caller.invoke(ECHO, args={"text": "pay"})
            assert response.status_code == 202, response.content
            approval = ApprovalRequest.objects.get(pk=response.json()["approvalId"])
            drain_queue()
            decisions.decide(approval.pk, operator, "approve")
            record = runner.resume(ApprovalRequest.objects.get(pk=approval.pk))
        assert record is not None
        return record

    same = held_then_run("Exclaims")  # the same arguments when checked again: it runs
    assert same.ok is True and same.result == {"text": "pay!"}
    assert ApprovalRequest.objects.get(invocation=same).args["text"] == "pay!"
    assert [entry["did"] for entry in same.hooks or []] == ["changed the arguments", "passed"]

    other = held_then_run("Stamps")  # new arguments at the run: not what was approved
    assert (other.ok, other.error_code) == (False, "policy_denied")
    assert other.safe_message == (
        f"The hook {H}Stamps changed the arguments after approval: the call differs from "
        "what was approved."
    )


# ---------------------------------------------------------------- hooks that misbehave


@pytest.mark.django_db
def test_a_hook_that_raises_ends_the_call_naming_it_and_the_tool_does_not_run(
    caller: Agent, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    with hooked("Explodes"):
        body = counted(caller, trace)
    assert body["ok"] is False and body["errorCode"] == "execution"
    assert body["safeMessage"] == (
        f"The hook {H}Explodes failed (RuntimeError); the tool was not run."
    )
    assert "hunter2" not in str(body)
    assert not trace.exists()
    assert body["hooks"] == [
        {"hook": H + "Explodes", "stage": "before_execution", "did": "raised RuntimeError"}
    ]


@pytest.mark.django_db
def test_a_hook_that_raises_after_the_result_withholds_it(caller: Agent) -> None:
    with hooked("ExplodesAfter"):
        body = echo(caller)
    assert body["errorCode"] == "execution"
    assert body["safeMessage"] == (
        f"The hook {H}ExplodesAfter failed (KeyError); the tool's result was not returned."
    )


@pytest.mark.django_db
@override_settings(TOOLHUB_HOOK_TIMEOUT_MS=100)
def test_a_hook_that_loops_times_out_naming_it(caller: Agent, loose: None, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with hooked("Loops"):
        body = counted(caller, trace)
    assert body["ok"] is False and body["errorCode"] == "timeout"
    assert body["safeMessage"] == (
        f"The hook {H}Loops did not finish within 0.1 s; the tool was not run."
    )
    assert not trace.exists()


@pytest.mark.django_db
def test_a_hook_answer_the_output_schema_refuses_is_output_invalid_naming_it(
    caller: Agent, tmp_path: Path
) -> None:
    with hooked("AnswersWrongly"):
        body = counted(caller, tmp_path / "trace")
    assert body["errorCode"] == "output_invalid"
    assert body["safeMessage"] == (
        f"The hook {H}AnswersWrongly gave a result that does not match the tool's declared output."
    )


@pytest.mark.django_db
def test_a_result_a_hook_spoils_is_output_invalid_naming_it(caller: Agent) -> None:
    with hooked("SpoilsResult"):
        body = echo(caller)
    assert body["errorCode"] == "output_invalid"
    assert f"The hook {H}SpoilsResult gave a result" in body["safeMessage"]


# ---------------------------------------------------------------- configuration


def test_a_hook_path_that_does_not_load_fails_the_system_check() -> None:
    cases = [
        (["tests.support.hooks.Nowhere"], "cannot be imported"),
        (["no_such_module.Hook"], "cannot be imported"),
        ([H + "NoStage"], "defines no stage"),
        (["apps.invocations.runner.Call"], "is not a subclass"),
        ([{"hook": H + "Aborts", "options": {"colour": "red"}}], "cannot be loaded"),
        ([{"hook": H + "Shouts", "effects": ["sometimes"]}], "'effects' names sometimes"),
        ([{"hook": H + "Shouts", "stage": "x"}], "unknown key 'stage'"),
        ([42], "a dotted path or an object"),
    ]
    for value, expected in cases:
        with override_settings(TOOLHUB_HOOKS=value):
            errors = checks.hooks_load()
        assert len(errors) == 1 and isinstance(errors[0], Error), value
        assert errors[0].id == "invocations.E001"
        assert expected in errors[0].msg and "TOOLHUB_HOOKS[0]" in errors[0].msg, errors[0].msg
    with (
        override_settings(TOOLHUB_HOOKS=["no_such_module.Hook"]),
        pytest.raises(SystemCheckError, match="no_such_module"),
    ):
        call_command("check")


@pytest.mark.django_db
def test_a_misconfigured_hook_at_run_time_is_a_recorded_refusal_not_a_500(
    caller: Agent,
) -> None:
    with override_settings(TOOLHUB_HOOKS=["no_such_module.Hook"]):
        response = caller.invoke(ECHO, args={"text": "hi"})
    assert response.status_code == 200
    assert response.json()["errorCode"] == "execution"
    assert "hooks could not be loaded" in response.json()["safeMessage"]


# ---------------------------------------------------------------- the hooks toolhub ships


@pytest.mark.django_db
def test_mask_pii_masks_emails_and_card_numbers_in_results(caller: Agent) -> None:
    entry = {"hook": "apps.invocations.hooks.mask_pii.MaskPii", "tools": [ECHO]}
    text = "mail ada@example.com, card 4111 1111 1111 1111, order 1234567890123"
    with override_settings(TOOLHUB_HOOKS=[entry]):
        body = echo(caller, text)
    assert body["result"]["text"] == "mail [email], card [card], order 1234567890123"
    assert body["hooks"][0]["did"] == "changed the result"


@pytest.mark.django_db
def test_business_hours_refuse_calls_outside_the_window(caller: Agent) -> None:
    now = datetime.now(UTC)

    def window(start: datetime, end: datetime) -> dict[str, Any]:
        options: dict[str, Any] = {"timezone": "UTC", "days": ["mon", "tue", "sat", "sun"]}
        options["days"] += ["wed", "thu", "fri"]
        options.update(start=f"{start:%H:%M}", end=f"{end:%H:%M}")
        return {"hook": "apps.invocations.hooks.business_hours.BusinessHours", "options": options}

    with override_settings(
        TOOLHUB_HOOKS=[window(now - timedelta(hours=1), now + timedelta(hours=1))]
    ):
        assert echo(caller)["ok"] is True
    with override_settings(
        TOOLHUB_HOOKS=[window(now + timedelta(hours=2), now + timedelta(hours=3))]
    ):
        body = echo(caller)
    assert body["errorCode"] == "policy_denied"
    assert "test__echo takes calls mon, tue, sat, sun, wed" in body["safeMessage"]
    assert (
        "(refused by the hook apps.invocations.hooks.business_hours.BusinessHours)"
        in (body["safeMessage"])
    )


def test_business_hours_over_midnight_belong_to_the_day_they_opened() -> None:
    night = BusinessHours(timezone="UTC", days=["fri"], start="22:00", end="06:00")
    assert night.open_at(datetime(2026, 11, 27, 23, 0, tzinfo=UTC))  # Friday night
    assert night.open_at(datetime(2026, 11, 28, 5, 59, tzinfo=UTC))  # Saturday early
    assert not night.open_at(datetime(2026, 11, 28, 23, 0, tzinfo=UTC))  # Saturday night
    assert not night.open_at(datetime(2026, 11, 27, 5, 0, tzinfo=UTC))  # Thursday's night
