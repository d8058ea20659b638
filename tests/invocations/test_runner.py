"""The runner's pipeline through real tools: records, error codes, ids, events, idempotency,
the planning suite and the clock."""

from __future__ import annotations

import json
import threading
import time

import pytest

from apps.invocations import runner
from apps.invocations.models import InvocationRecord, RunEvent
from apps.invocations.requests import InvocationRequest
from apps.tenants.callers import Caller
from tests.conftest import allow
from tests.support.responses import failure, ok_result, record_of

pytestmark = pytest.mark.django_db(transaction=True)

CLOCK = "core__get_current_time"
SETUP = "core__planning_setup_plan"
ADD = "core__planning_add_step"
UPDATE = "core__planning_update_step"
READ = "core__planning_read_plan"


@pytest.fixture
def tester(agent, test_tools):
    """The `acme` agent, also allowed every test tool."""
    allow(agent.tenant, *test_tools, name="test tools")
    return agent


# ---------------------------------------------------------------- every call leaves a record


def test_a_successful_call_leaves_a_complete_record(tester):
    response = tester.invoke(
        "test__echo",
        args={"text": "hello", "secret_note": "the vault code is 1234"},
        toolCallId="call-rec",
        runId="run-rec",
    )
    assert ok_result(response) == {"text": "hello"}
    record = record_of(response)
    assert record.tenant == tester.tenant
    assert record.principal == "agent:test"
    assert record.tool_id == "test__echo"
    assert record.tool_call_id == "call-rec"
    assert record.run_id == "run-rec"
    assert record.status == "succeeded"
    assert record.ok is True
    assert record.error_code == ""
    assert record.policy_rule.startswith("policy:")
    assert record.started_at is not None
    assert record.ended_at >= record.started_at
    assert record.duration_ms is not None
    assert record.args == {"text": "hello"}
    assert record.args_shape == {"text": "string[5]", "secret_note": "string[22]"}
    assert record.result == {"text": "hello"}
    stored = json.dumps([record.args, record.args_shape, record.result])
    assert "vault code" not in stored


def test_a_call_denied_by_default_leaves_a_record_with_only_the_args_shape(bare_agent):
    response = bare_agent.invoke(
        CLOCK, args={"timezone": "Europe/Paris"}, toolCallId="call-den", runId="run-den"
    )
    code, message = failure(response)
    assert code == "policy_denied"
    assert message == f"No policy of this tenant allows {CLOCK}."
    record = record_of(response)
    assert record.tenant == bare_agent.tenant
    assert record.principal == "agent:lonely"
    assert record.error_code == "policy_denied"
    assert record.policy_rule == "default:deny"
    assert record.tool_call_id == "call-den"
    assert record.run_id == "run-den"
    assert record.status == "failed"
    assert record.ok is False
    assert record.started_at is not None
    assert record.ended_at is not None
    assert record.duration_ms is not None
    assert record.args is None
    assert record.args_shape == {"timezone": "string[12]"}
    assert "Europe/Paris" not in json.dumps(record.args_shape)


def test_a_call_refused_at_validation_keeps_no_values(tester):
    response = tester.invoke("test__echo", args={"text": 42, "secret_note": "pw=hunter2"})
    code, message = failure(response)
    assert code == "validation"
    assert "text" in message
    assert "hunter2" not in message
    record = record_of(response)
    assert record.args is None
    assert record.args_shape == {"text": "number", "secret_note": "string[10]"}
    assert "hunter2" not in json.dumps([record.args_shape, record.safe_message])


def test_each_attempt_leaves_its_own_record(tester, bare_agent):
    tester.invoke("test__echo", args={"text": "a"})
    tester.invoke("test__crash", args={})
    tester.invoke("core__nope", args={})
    bare_agent.invoke(CLOCK, args={})
    assert InvocationRecord.objects.filter(tenant=tester.tenant).count() == 3
    assert InvocationRecord.objects.filter(tenant=bare_agent.tenant).count() == 1
    codes = set(InvocationRecord.objects.values_list("error_code", flat=True))
    assert codes == {"", "execution", "unavailable", "policy_denied"}


def test_the_runner_can_be_called_directly_with_a_caller(tester):
    caller = Caller.for_api_key(tester.tenant.api_keys.get())
    request = InvocationRequest.model_validate({"toolId": "test__echo", "args": {"text": "direct"}})
    record = runner.invoke(caller, request)
    assert record.ok is True
    assert record.result == {"text": "direct"}
    assert record.principal == "agent:test"


# ---------------------------------------------------------------- error codes


def test_a_crashing_tool_gives_a_generic_execution_error(tester):
    response = tester.invoke("test__crash", args={})
    code, message = failure(response)
    assert code == "execution"
    assert message == "The tool failed unexpectedly."
    text = response.content.decode()
    assert "hunter2" not in text
    assert "Traceback" not in text
    assert "/srv/app.py" not in text
    record = record_of(response)
    assert "hunter2" not in record.safe_message
    events = RunEvent.objects.filter(run_id=record.run_id)
    assert "hunter2" not in json.dumps([e.message for e in events])


def test_a_tool_error_passes_on_the_tools_own_message(tester):
    code, message = failure(tester.invoke("test__refuse", args={}))
    assert code == "execution"
    assert message == "The upstream service said no."


def test_a_tool_that_overruns_its_timeout_is_cut_off(tester):
    started = time.monotonic()
    response = tester.invoke("test__sleep", args={"seconds": 5})
    elapsed = time.monotonic() - started
    code, message = failure(response)
    assert code == "timeout"
    assert "0.5 s" in message
    assert elapsed < 3
    assert record_of(response).status == "failed"


def test_a_provider_that_times_out_first_ends_the_call_as_a_timeout_too(tester):
    # At the deadline the runner's wait and the provider's own wait (an MCP session's)
    # race; whichever wins, the caller sees the same code and message.
    code, message = failure(tester.invoke("test__provider_timeout", args={}))
    assert (code, message) == ("timeout", "The tool did not finish within 0.5 s.")
    record = InvocationRecord.objects.get(tool_ref="test__provider_timeout")
    assert (record.status, record.error_code) == ("failed", "timeout")


# ---------------------------------------------------------------- tools that run inline


def test_a_tool_that_runs_inline_runs_on_the_callers_thread_and_others_on_a_tool_thread(tester):
    here = threading.current_thread().name  # the test client runs the view on this thread
    assert ok_result(tester.invoke("test__inline_where", args={})) == {"thread": here}
    elsewhere = ok_result(tester.invoke("test__where", args={}))["thread"]
    assert elsewhere.startswith("toolhub-tool")


def test_the_clock_runs_inline_and_records_its_call_as_before(tester):
    from apps.tools.registry import registry

    assert registry.get(CLOCK).contract.runs_inline
    response = tester.invoke(CLOCK, args={"timezone": "Europe/Paris"}, runId="run-inline")
    assert ok_result(response)["timezone"] == "Europe/Paris"
    record = record_of(response)
    assert (record.status, record.ok) == ("succeeded", True)
    kinds = [e.type for e in RunEvent.objects.filter(run_id="run-inline").order_by("seq")]
    assert kinds == ["tool_call_start", "tool_call_result"]


def test_a_tool_that_runs_inline_past_its_deadline_is_a_timeout_not_a_result(tester):
    response = tester.invoke("test__inline_overrun", args={})
    code, message = failure(response)
    assert (code, message) == ("timeout", "The tool did not finish within 0.05 s.")
    record = record_of(response)
    assert (record.status, record.error_code, record.result) == ("failed", "timeout", None)
    assert "waited" not in response.content.decode()  # the late answer is not shown


@pytest.mark.parametrize(
    ("how", "code", "message"),
    [
        ("refuse", "execution", "The inline tool said no."),
        ("crash", "execution", "The tool failed unexpectedly."),
        ("timed_out", "timeout", "The tool did not finish within 15 s."),
    ],
)
def test_a_tool_that_runs_inline_fails_as_one_on_a_thread_does(tester, how, code, message):
    response = tester.invoke("test__inline_fail", args={"how": how})
    assert failure(response) == (code, message)
    record = record_of(response)
    assert (record.status, record.error_code) == ("failed", code)
    assert "hunter2" not in response.content.decode() + record.safe_message


def test_a_tool_that_runs_inline_still_refuses_bad_arguments(tester):
    code, _ = failure(tester.invoke("test__inline_fail", args={"how": "explode"}))
    assert code == "validation"


def test_a_result_that_does_not_match_the_declared_output_is_output_invalid(tester):
    code, message = failure(tester.invoke("test__wrong_output", args={}))
    assert code == "output_invalid"
    assert "not a number" not in message


def test_a_result_over_32_kb_is_too_large(tester):
    code, message = failure(tester.invoke("test__big_output", args={"size": 40000}))
    assert code == "result_too_large"
    assert "32768" in message


def test_a_small_result_is_returned(tester):
    assert ok_result(tester.invoke("test__big_output", args={"size": 1000})) == {"blob": "x" * 1000}


def test_a_tool_that_needs_confirmation_is_held_for_a_human(tester):
    response = tester.invoke("test__confirm", args={})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "pending_approval"
    assert body["approvalId"]
    assert "ok" not in body and "result" not in body
    record = record_of(response)
    assert record.status == "pending_approval"
    assert record.started_at is None
    assert record.approval.status == "pending"


# ---------------------------------------------------------------- toolCallId and runId


def test_the_callers_tool_call_id_and_run_id_are_kept_end_to_end(tester):
    response = tester.invoke(
        "test__echo", args={"text": "x"}, toolCallId="toolu_01ABC", runId="r-1"
    )
    body = response.json()
    assert body["toolCallId"] == "toolu_01ABC"
    assert body["runId"] == "r-1"
    record = record_of(response)
    assert (record.tool_call_id, record.run_id) == ("toolu_01ABC", "r-1")
    events = list(RunEvent.objects.filter(tenant=tester.tenant, run_id="r-1"))
    assert [e.tool_call_id for e in events] == ["toolu_01ABC", "toolu_01ABC"]
    assert {e.message["toolCallId"] for e in events} == {"toolu_01ABC"}


def test_missing_ids_are_generated_and_used_end_to_end(tester):
    response = tester.invoke("test__echo", args={"text": "x"})
    body = response.json()
    assert body["toolCallId"].startswith("call_")
    assert body["runId"].startswith("run_")
    other = tester.invoke("test__echo", args={"text": "x"}).json()
    assert other["toolCallId"] != body["toolCallId"]
    assert other["runId"] != body["runId"]
    events = list(RunEvent.objects.filter(run_id=body["runId"]))
    assert [e.message["toolCallId"] for e in events] == [body["toolCallId"]] * 2


def test_a_refused_call_keeps_the_callers_tool_call_id(bare_agent):
    response = bare_agent.invoke(CLOCK, args={}, toolCallId="call-refused")
    assert response.json()["toolCallId"] == "call-refused"
    assert record_of(response).tool_call_id == "call-refused"


# ---------------------------------------------------------------- events


START_KEYS = {"v", "seq", "type", "runId", "toolCallId", "toolId", "at", "args"}
RESULT_KEYS = {"v", "seq", "type", "runId", "toolCallId", "toolId", "at", "ok", "durationMs"}


def test_a_call_emits_start_then_result_with_increasing_sequence_numbers(tester):
    tester.invoke(
        "test__echo", args={"text": "one", "secret_note": "s3"}, runId="ev", toolCallId="c1"
    )
    tester.invoke("test__refuse", args={}, runId="ev", toolCallId="c2")
    events = list(RunEvent.objects.filter(tenant=tester.tenant, run_id="ev").order_by("seq"))
    assert [(e.type, e.tool_call_id) for e in events] == [
        ("tool_call_start", "c1"),
        ("tool_call_result", "c1"),
        ("tool_call_start", "c2"),
        ("tool_call_result", "c2"),
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.message["seq"] for e in events] == [1, 2, 3, 4]

    start, ok, start2, failed = (e.message for e in events)
    assert set(start) >= START_KEYS
    assert start["v"] == 1
    assert start["type"] == "tool_call_start"
    assert start["runId"] == "ev"
    assert start["toolId"] == "test__echo"
    assert start["args"] == {"text": "one"}  # redacted: secret_note dropped
    assert start["at"].endswith("Z")

    assert set(ok) >= RESULT_KEYS | {"result"}
    assert ok["ok"] is True
    assert ok["result"] == {"text": "one"}
    assert "errorCode" not in ok

    assert start2["args"] == {}
    assert set(failed) >= RESULT_KEYS | {"errorCode", "safeMessage"}
    assert failed["ok"] is False
    assert failed["errorCode"] == "execution"
    assert failed["safeMessage"] == "The upstream service said no."
    assert "result" not in failed


def test_a_refused_call_also_emits_start_and_result(bare_agent):
    bare_agent.invoke(CLOCK, args={"timezone": "UTC"}, runId="ev-denied")
    events = list(RunEvent.objects.filter(run_id="ev-denied").order_by("seq"))
    assert [e.type for e in events] == ["tool_call_start", "tool_call_result"]
    assert events[0].message["args"] is None  # unvalidated args never travel
    assert events[1].message["errorCode"] == "policy_denied"


def test_sequence_numbers_are_per_run_and_per_tenant(tester, stranger):
    tester.invoke("test__echo", args={"text": "a"}, runId="same")
    stranger.invoke(CLOCK, args={}, runId="same")
    tester.invoke("test__echo", args={"text": "b"}, runId="other")
    assert list(
        RunEvent.objects.filter(tenant=stranger.tenant, run_id="same").values_list("seq", flat=True)
    ) == [1, 2]
    assert list(
        RunEvent.objects.filter(tenant=tester.tenant, run_id="other").values_list("seq", flat=True)
    ) == [1, 2]


# ---------------------------------------------------------------- idempotency


def test_the_same_idempotency_key_executes_once(tester):
    first = tester.invoke("test__echo", args={"text": "once"}, idempotencyKey="k-1", runId="idem")
    second = tester.invoke("test__echo", args={"text": "once"}, idempotencyKey="k-1", runId="idem")
    assert first.status_code == second.status_code == 200
    assert second.json()["invocationId"] == first.json()["invocationId"]
    assert second.json()["result"] == {"text": "once"}
    assert InvocationRecord.objects.filter(tenant=tester.tenant).count() == 1
    assert RunEvent.objects.filter(run_id="idem").count() == 2


def test_the_same_idempotency_key_with_other_args_is_refused(tester):
    first = tester.invoke("test__echo", args={"text": "once"}, idempotencyKey="k-2")
    second = tester.invoke("test__echo", args={"text": "twice"}, idempotencyKey="k-2")
    code, message = failure(second)
    assert code == "validation"
    assert "idempotencyKey" in message
    assert second.json()["invocationId"] != first.json()["invocationId"]
    assert record_of(first).result == {"text": "once"}


def test_idempotency_keys_of_different_tenants_do_not_collide(agent, stranger):
    mine = agent.invoke(CLOCK, args={}, idempotencyKey="shared-key")
    theirs = stranger.invoke(CLOCK, args={}, idempotencyKey="shared-key")
    assert mine.json()["ok"] is True
    assert theirs.json()["ok"] is True
    assert mine.json()["invocationId"] != theirs.json()["invocationId"]
    assert record_of(theirs).tenant == stranger.tenant


# ---------------------------------------------------------------- the planning suite


def plan(agent, tool: str, run: str = "plan-run", **args):
    return agent.invoke(tool, args=args, runId=run)


def step_ids(result: dict) -> list[int]:
    return [step["step_id"] for step in result["steps"]]


def test_setup_plan_creates_the_plan_with_its_first_steps(agent):
    result = ok_result(plan(agent, SETUP, objective="Ship it", initial_steps=["a", "b"]))
    assert result == {
        "objective": "Ship it",
        "status": "active",
        "steps": [
            {"step_id": 1, "title": "a", "status": "pending"},
            {"step_id": 2, "title": "b", "status": "pending"},
        ],
    }
    assert ok_result(plan(agent, READ)) == result


def test_add_step_appends_with_ids_continuing(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a", "b"])
    result = ok_result(plan(agent, ADD, steps=["c", "d"]))
    assert step_ids(result) == [1, 2, 3, 4]
    assert [s["title"] for s in result["steps"]] == ["a", "b", "c", "d"]


def test_a_plan_with_every_step_done_is_completed(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a", "b"])
    assert ok_result(plan(agent, UPDATE, step_id=1, status="done"))["status"] == "active"
    assert ok_result(plan(agent, UPDATE, step_id=2, status="in_progress"))["status"] == "active"
    result = ok_result(plan(agent, UPDATE, step_id=2, status="done"))
    assert result["status"] == "completed"
    assert ok_result(plan(agent, READ))["status"] == "completed"


def test_adding_a_step_to_a_completed_plan_is_refused_clearly(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    plan(agent, UPDATE, step_id=1, status="done")
    code, message = failure(plan(agent, ADD, steps=["more"]))
    assert code == "execution"
    assert message == "The plan is completed; set up a new plan to continue."
    assert step_ids(ok_result(plan(agent, READ))) == [1]


def test_updating_an_unknown_step_is_refused_clearly(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    code, message = failure(plan(agent, UPDATE, step_id=99, status="done"))
    assert code == "execution"
    assert message == "The plan has no step 99."


def test_reading_a_run_without_a_plan_is_refused_clearly(agent):
    code, message = failure(plan(agent, READ, run="no-plan-here"))
    assert code == "execution"
    assert "no plan" in message
    assert SETUP in message


def test_adding_to_a_run_without_a_plan_is_refused_clearly(agent):
    code, message = failure(plan(agent, ADD, run="no-plan-here", steps=["x"]))
    assert code == "execution"
    assert "no plan" in message


def test_setting_up_again_replaces_the_plan_without_reusing_step_ids(agent):
    plan(agent, SETUP, objective="First", initial_steps=["a", "b", "c"])
    plan(agent, UPDATE, step_id=3, status="done")
    result = ok_result(plan(agent, SETUP, objective="Second", initial_steps=["x", "y"]))
    assert result["objective"] == "Second"
    assert result["status"] == "active"
    assert [s["title"] for s in result["steps"]] == ["x", "y"]
    assert min(step_ids(result)) > 3
    assert step_ids(result) == [4, 5]
    code, message = failure(plan(agent, UPDATE, step_id=1, status="done"))
    assert (code, message) == ("execution", "The plan has no step 1.")


def test_setting_up_a_completed_plan_again_makes_it_active(agent):
    plan(agent, SETUP, objective="First", initial_steps=["a"])
    plan(agent, UPDATE, step_id=1, status="done")
    result = ok_result(plan(agent, SETUP, objective="Again", initial_steps=["b"]))
    assert result["status"] == "active"
    assert step_ids(ok_result(plan(agent, ADD, steps=["c"]))) == [2, 3]


def test_plans_are_per_run(agent):
    plan(agent, SETUP, run="run-1", objective="One", initial_steps=["a"])
    plan(agent, SETUP, run="run-2", objective="Two", initial_steps=["x", "y"])
    assert ok_result(plan(agent, READ, run="run-1"))["objective"] == "One"
    second = ok_result(plan(agent, READ, run="run-2"))
    assert second["objective"] == "Two"
    assert step_ids(second) == [1, 2]


def test_plans_are_per_tenant(agent, stranger):
    plan(agent, SETUP, run="shared", objective="Ours", initial_steps=["a"])
    code, _ = failure(plan(stranger, READ, run="shared"))
    assert code == "execution"
    failure(plan(stranger, UPDATE, run="shared", step_id=1, status="done"))
    assert ok_result(plan(agent, READ, run="shared"))["steps"][0]["status"] == "pending"


def test_a_step_title_over_500_characters_is_a_validation_error(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    code, message = failure(plan(agent, ADD, steps=["t" * 501]))
    assert code == "validation"
    assert "steps.0" in message
    code, message = failure(plan(agent, UPDATE, step_id=1, title="t" * 501))
    assert code == "validation"
    assert "title" in message
    code, message = failure(plan(agent, SETUP, run="other", objective="o" * 501))
    assert code == "validation"
    assert "objective" in message


def test_an_empty_title_is_a_validation_error(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    code, message = failure(plan(agent, ADD, steps=["   "]))
    assert code == "validation"
    assert "steps.0" in message
    code, message = failure(plan(agent, SETUP, objective=""))
    assert code == "validation"
    assert "objective" in message


def test_update_step_needs_a_title_or_a_status(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    code, message = failure(plan(agent, UPDATE, step_id=1))
    assert code == "validation"
    assert "give a new title, a new status, or both" in message


def test_update_step_refuses_an_unknown_status(agent):
    plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    code, message = failure(plan(agent, UPDATE, step_id=1, status="finished"))
    assert code == "validation"
    assert "status" in message


def test_planning_args_are_recorded_redacted_to_their_allowlist(agent):
    response = plan(agent, SETUP, objective="Ship it", initial_steps=["a"])
    assert record_of(response).args == {"objective": "Ship it", "initial_steps": ["a"]}
    assert record_of(plan(agent, READ)).args == {}


def test_a_change_that_would_make_the_plan_too_large_to_return_is_not_applied(agent):
    plan(agent, SETUP, objective="Big", initial_steps=[])
    batch = [f"{n:03d} " + "t" * 490 for n in range(15)]  # ~7.5 KB of args per call
    added = 0
    for _ in range(10):
        response = plan(agent, ADD, steps=batch)
        if not response.json()["ok"]:
            break
        added += len(batch)
    code, message = failure(response)
    assert code == "execution"
    assert "too large" in message
    assert added > 0
    # Nothing of the refused call was kept: the plan is still readable and unchanged.
    assert len(ok_result(plan(agent, READ))["steps"]) == added


# ---------------------------------------------------------------- the clock


def test_the_clock_defaults_to_utc(agent):
    result = ok_result(agent.invoke(CLOCK, args={}))
    assert result["timezone"] == "UTC"
    assert result["iso"].endswith("+00:00")
    assert abs(result["unix"] - time.time()) < 60


def test_the_clock_gives_the_time_in_a_valid_zone(agent):
    result = ok_result(agent.invoke(CLOCK, args={"timezone": "Asia/Kolkata"}))
    assert result["timezone"] == "Asia/Kolkata"
    assert result["iso"].endswith("+05:30")


def test_the_clock_refuses_an_unknown_zone_clearly(agent):
    code, message = failure(agent.invoke(CLOCK, args={"timezone": "Mars/Olympus"}))
    assert code == "execution"
    assert "Unknown time zone 'Mars/Olympus'" in message


@pytest.mark.parametrize("zone", ["../../etc/passwd", "/etc/localtime", "UTC/../UTC"])
def test_the_clock_refuses_a_path_like_zone_without_crashing(agent, zone):
    code, message = failure(agent.invoke(CLOCK, args={"timezone": zone}))
    assert code == "execution"
    assert "time zone" in message
    assert "failed unexpectedly" not in message
