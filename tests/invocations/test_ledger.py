"""The idempotency ledger (seed 002): strategies, scope, TTL, invalidation, pruning, and
only successful calls remembered, through the API and the runner's real path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from apps.invocations import ledger
from apps.invocations.models import IdempotencyEntry
from apps.tools import call_settings
from apps.tools.contracts import Idempotency, Redaction, Retries, ToolContract
from apps.tools.models import Tool
from apps.tools.registry import ToolRegistrationError, check_contract, registry
from tests.conftest import Agent, allow, make_agent
from tests.support import tools as support_tools
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
SLOW = "test__counted_wait"
FLAKY = "test__flaky"


@pytest.fixture
def tester(agent: Agent, test_tools: list[str]) -> Agent:
    allow(agent.tenant, *test_tools, name="test tools")
    return agent


def wait_args(trace: Path, ms: int, token: str = "t") -> dict[str, Any]:
    return {"path": str(trace), "token": token, "ms": ms}


def executions(trace: Path, token: str = "t") -> int:
    return trace.read_text(encoding="utf-8").splitlines().count(token) if trace.exists() else 0


def settings_of(tool_id: str, **fields: Any) -> None:
    Tool.objects.filter(pk=tool_id).update(**fields)


def running(key: str) -> None:
    """Wait until a call holding `key` is recorded (its tool then runs)."""
    while not IdempotencyEntry.objects.filter(key=key).exists():
        time.sleep(0.01)


# ---------------------------------------------------------------- only successes remembered


def test_a_retry_after_a_failed_call_runs_again_and_names_the_attempt_before(tester, tmp_path):
    args = {"path": str(tmp_path / "t.log"), "token": "t", "failures": 1}

    first = tester.invoke(FLAKY, args=args, idempotencyKey="pay-1").json()
    second = tester.invoke(FLAKY, args=args, idempotencyKey="pay-1").json()
    third = tester.invoke(FLAKY, args=args, idempotencyKey="pay-1").json()

    assert (first["ok"], first["errorCode"]) == (False, "unavailable")
    assert "retryOf" not in first and "attempt" not in first
    assert second["ok"] is True and second["invocationId"] != first["invocationId"]
    assert (second["retryOf"], second["attempt"]) == (first["invocationId"], 2)
    assert third == second  # a success is remembered: replayed, not run
    assert executions(tmp_path / "t.log") == 2


def test_the_same_key_with_other_arguments_is_a_conflict(tester, tmp_path):
    tester.invoke(SLOW, args=wait_args(tmp_path / "t.log", 0), idempotencyKey="k")

    other = tester.invoke(SLOW, args=wait_args(tmp_path / "t.log", 1), idempotencyKey="k").json()

    assert (other["ok"], other["errorCode"]) == (False, "validation")
    assert "already used for a different call" in other["safeMessage"]
    assert executions(tmp_path / "t.log") == 1


# ---------------------------------------------------------------- TTL and invalidation


def test_a_key_whose_ttl_ran_out_while_its_call_ran_is_not_run_beside_it(tester, tmp_path):
    trace = tmp_path / "t.log"
    body = {"args": wait_args(trace, 600), "idempotencyKey": "ttl-1"}
    answers: list[Any] = []
    thread = start_thread(lambda: answers.append(tester.invoke(SLOW, **body)))
    running("ttl-1")
    IdempotencyEntry.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    retry = tester.invoke(SLOW, **body)  # the TTL ran out: still the running call's key
    thread.join()
    after = tester.invoke(SLOW, **body)  # now the key is forgotten: it runs again

    assert retry.json() == answers[0].json() and retry.json()["ok"] is True
    assert after.json()["ok"] is True
    assert after.json()["invocationId"] != retry.json()["invocationId"]
    assert "retryOf" not in after.json()  # a new use of the key, not a retry of a failure
    assert executions(trace) == 2


def test_invalidating_a_key_while_its_call_runs_lets_it_finish_alone(tester, tmp_path):
    trace = tmp_path / "t.log"
    body = {"args": wait_args(trace, 600), "idempotencyKey": "inv-1"}
    answers: list[Any] = []
    thread = start_thread(lambda: answers.append(tester.invoke(SLOW, **body)))
    running("inv-1")

    forgotten = tester.client.post(
        "/api/v1/idempotency-keys/invalidate/", {"key": "inv-1"}, format="json"
    )
    retry = tester.invoke(SLOW, **body)
    thread.join()
    after = tester.invoke(SLOW, **body)

    assert forgotten.status_code == 200 and forgotten.json() == {"invalidated": 1}
    assert retry.json() == answers[0].json()  # waited for the running call
    assert after.json()["invocationId"] != retry.json()["invocationId"]
    assert executions(trace) == 2


def test_invalidation_by_tool_and_principal_stays_in_its_scope(tester, tmp_path):
    trace = tmp_path / "t.log"
    tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="a")
    tester.invoke(FLAKY, args={"path": str(trace), "token": "f", "failures": 0}, idempotencyKey="b")

    by_tool = tester.client.post(
        "/api/v1/idempotency-keys/invalidate/", {"toolId": SLOW}, format="json"
    )
    again = tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="a").json()
    kept = tester.invoke(
        FLAKY, args={"path": str(trace), "token": "f", "failures": 0}, idempotencyKey="b"
    ).json()

    assert by_tool.json() == {"invalidated": 1}
    assert executions(trace) == 2 and executions(trace, "f") == 1
    assert again["ok"] is True and kept["ok"] is True


def test_an_agent_may_not_forget_another_principals_keys(tester):
    other = tester.client.post(
        "/api/v1/idempotency-keys/invalidate/", {"principal": "agent:else"}, format="json"
    )
    nothing = tester.client.post("/api/v1/idempotency-keys/invalidate/", {}, format="json")

    assert other.status_code == 403
    assert nothing.status_code == 400
    assert "give a key, a toolId or a principal" in nothing.content.decode()


def test_pruning_forgets_expired_keys_of_ended_calls_only(tester, tmp_path):
    trace = tmp_path / "t.log"
    tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="old")
    thread = start_thread(
        lambda: tester.invoke(SLOW, args=wait_args(trace, 400, "r"), idempotencyKey="run")
    )
    running("run")
    IdempotencyEntry.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    pruned = ledger.prune()
    thread.join()

    assert pruned == 1
    assert list(IdempotencyEntry.objects.values_list("key", flat=True)) == ["run"]
    assert ledger.prune() == 1  # ended now: forgotten on the next pass


# ---------------------------------------------------------------- strategies and scope


def test_strategy_auto_derives_the_key_from_the_arguments(tester, tmp_path):
    settings_of(SLOW, idempotency_strategy="auto")
    trace = tmp_path / "t.log"

    first = tester.invoke(SLOW, args=wait_args(trace, 0)).json()
    same = tester.invoke(SLOW, args=wait_args(trace, 0)).json()
    other = tester.invoke(SLOW, args=wait_args(trace, 1)).json()

    assert same == first and first["idempotencyKey"].startswith("auto:")
    assert other["invocationId"] != first["invocationId"]
    assert executions(trace) == 2


def test_strategy_params_refuses_the_same_named_arguments_with_other_ones(tester, tmp_path):
    settings_of(SLOW, idempotency_strategy="params", idempotency_params=["token"])
    trace = tmp_path / "t.log"

    first = tester.invoke(SLOW, args=wait_args(trace, 0)).json()
    other = tester.invoke(SLOW, args=wait_args(trace, 1)).json()

    assert first["ok"] is True and first["idempotencyKey"].startswith("params:")
    assert other["errorCode"] == "validation"
    assert executions(trace) == 1


def test_strategy_none_ignores_a_key(tester, tmp_path):
    settings_of(SLOW, idempotency_strategy="none")
    trace = tmp_path / "t.log"

    tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="k")
    second = tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="k").json()

    assert "idempotencyKey" not in second
    assert executions(trace) == 2


def test_keys_are_per_principal_by_default_and_shared_in_scope_tenant(tester, tmp_path):
    colleague = make_agent(tester.tenant.slug, "agent:colleague")
    trace = tmp_path / "t.log"
    body = {"args": wait_args(trace, 0), "idempotencyKey": "shared"}

    tester.invoke(SLOW, **body)
    colleague.invoke(SLOW, **body)
    assert executions(trace) == 2

    settings_of(SLOW, idempotency_scope="tenant")
    tester.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="tenant-wide")
    colleague.invoke(SLOW, args=wait_args(trace, 0), idempotencyKey="tenant-wide")
    assert executions(trace) == 3


# ---------------------------------------------------------------- defaults per effect

SEND = "test__flaky_send"  # an external side effect without idempotency in its contract


def send_args(trace: Path, token: str = "t") -> dict[str, Any]:
    return {"path": str(trace), "token": token, "failures": 0}


def test_the_shipped_defaults_keep_the_callers_key_for_every_effect(test_tools):
    settings = {
        tool.effect: (tool.idempotency_strategy, tool.idempotency_scope)
        for tool in Tool.objects.filter(pk__in=[SLOW, SEND])
    }
    assert settings["external_side_effect"] == ("custom", "principal")
    assert settings["read_only"] == ("custom", "principal")
    assert call_settings.default_idempotency("state_change").strategy == "custom"


def derive_keys_in_runs(settings: Any) -> None:
    """A deployment's choice: external side effects deduplicated within a run by their
    arguments (TOOLHUB_IDEMPOTENCY_DEFAULTS), taken by the tools at their next sync."""
    settings.TOOLHUB_IDEMPOTENCY_DEFAULTS = {
        "external_side_effect": {"strategy": "auto", "scope": "run"}
    }
    Tool.objects.sync_registry(registry)


def test_an_external_call_re_sent_in_its_run_replays_without_a_key(tester, tmp_path, settings):
    derive_keys_in_runs(settings)
    trace = tmp_path / "t.log"

    first = tester.invoke(SEND, args=send_args(trace), runId="run-a").json()
    again = tester.invoke(SEND, args=send_args(trace), runId="run-a").json()
    other_run = tester.invoke(SEND, args=send_args(trace), runId="run-b").json()
    other_args = tester.invoke(SEND, args=send_args(trace, "u"), runId="run-a").json()

    assert first["ok"] is True and again == first
    assert first["idempotencyStrategy"] == "auto" and first["idempotencyKey"].startswith("auto:")
    assert other_run["invocationId"] != first["invocationId"]
    assert other_args["invocationId"] != first["invocationId"]
    assert executions(trace) == 2 and executions(trace, "u") == 1


def test_by_default_an_external_call_re_sent_in_its_run_runs_again(tester, tmp_path):
    trace = tmp_path / "t.log"

    first = tester.invoke(SEND, args=send_args(trace), runId="run-a").json()
    again = tester.invoke(SEND, args=send_args(trace), runId="run-a").json()

    assert first["ok"] is True and again["ok"] is True
    assert again["invocationId"] != first["invocationId"]
    assert executions(trace) == 2


def test_an_external_call_without_a_run_is_deduplicated_by_the_callers_key_only(tester, tmp_path):
    trace = tmp_path / "t.log"

    tester.invoke(SEND, args=send_args(trace))
    keyless = tester.invoke(SEND, args=send_args(trace)).json()
    keyed = tester.invoke(SEND, args=send_args(trace), idempotencyKey="s-1").json()
    replay = tester.invoke(SEND, args=send_args(trace), idempotencyKey="s-1").json()

    assert "idempotencyKey" not in keyless and "idempotencyStrategy" not in keyless
    assert (keyed["idempotencyKey"], keyed["idempotencyStrategy"]) == ("s-1", "custom")
    assert replay == keyed
    assert executions(trace) == 3


def test_a_callers_key_wins_over_a_derived_one_whatever_the_strategy(tester, tmp_path):
    settings_of(SLOW, idempotency_strategy="params", idempotency_params=["token"])
    trace = tmp_path / "t.log"

    # In one run, the same arguments with two keys the caller meant as distinct: both run.
    a = tester.invoke(SEND, args=send_args(trace), runId="r", idempotencyKey="a").json()
    b = tester.invoke(SEND, args=send_args(trace), runId="r", idempotencyKey="b").json()
    # Strategy params: the caller's key, not the named arguments, decides.
    p1 = tester.invoke(SLOW, args=wait_args(trace, 0, "p"), idempotencyKey="p1").json()
    p2 = tester.invoke(SLOW, args=wait_args(trace, 1, "p"), idempotencyKey="p2").json()

    assert a["ok"] is True and b["ok"] is True and a["invocationId"] != b["invocationId"]
    assert executions(trace) == 2
    assert (p1["idempotencyKey"], p2["idempotencyKey"]) == ("p1", "p2")
    assert p2["ok"] is True and executions(trace, "p") == 2


def test_the_setting_changes_an_effects_default_and_a_contract_still_wins(test_tools, settings):
    settings.TOOLHUB_IDEMPOTENCY_DEFAULTS = {
        "read_only": {"strategy": "auto", "scope": "tenant", "ttl_s": 600},
        "external_side_effect": {"scope": "tenant"},
    }
    Tool.objects.sync_registry(registry)
    own = _contract(Idempotency(strategy="custom", ttl_s=60), effect="read_only")

    slow, send = Tool.objects.get(pk=SLOW), Tool.objects.get(pk=SEND)

    assert slow.idempotency == Idempotency(strategy="auto", scope="tenant", ttl_s=600)
    assert (send.idempotency_strategy, send.idempotency_scope) == ("custom", "tenant")
    assert own.call_idempotency == Idempotency(strategy="custom", ttl_s=60)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"external_side_effect": {"strategy": "none"}}, "['external_side_effect']: strategy none"),
        ({"read_only": {"strategy": "params"}}, "['read_only']: strategy params"),
        ({"read_only": {"strategy": "guess"}}, "['read_only']: idempotency strategy must"),
        ({"state_change": {"scope": "world"}}, "['state_change']: idempotency scope must"),
        ({"state_change": {"ttl_s": 0}}, "['state_change']: idempotency TTL must"),
        ({"state_change": {"ttl_s": "1h"}}, "['state_change']: ttl_s must be a whole"),
        ({"read_only": {"ttl": 60}}, "['read_only']: unknown key(s) ttl"),
        ({"write": {"strategy": "auto"}}, "['write']: not an effect"),
        ({"read_only": "auto"}, "['read_only']: must be an object"),
        (["auto"], "must be an object of effect"),
    ],
)
def test_a_bad_defaults_setting_is_refused_naming_the_entry(settings, value, named):
    settings.TOOLHUB_IDEMPOTENCY_DEFAULTS = value
    with pytest.raises(ImproperlyConfigured) as refused:
        call_settings.idempotency_defaults()
    assert named in str(refused.value)
    assert "TOOLHUB_IDEMPOTENCY_DEFAULTS" in str(refused.value)


def test_a_bad_defaults_setting_stops_start_up(tmp_path):
    env = {
        **os.environ,
        "TOOLHUB_DEBUG": "1",
        "TOOLHUB_VAR_DIR": str(tmp_path),
        "TOOLHUB_IDEMPOTENCY_DEFAULTS": '{"external_side_effect": {"strategy": "none"}}',
    }
    started = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert "TOOLHUB_IDEMPOTENCY_DEFAULTS['external_side_effect']: strategy none" in started.stderr


# ---------------------------------------------------------------- refused settings


def _contract(idempotency: Idempotency, effect: str = "state_change") -> ToolContract:
    return ToolContract(
        name="bad_settings",
        description="A tool with settings that cannot work.",
        params=support_tools.CountedWait,
        result=support_tools.Tallied,
        execute=support_tools.counted_wait,
        effect=effect,  # type: ignore[arg-type]
        redaction=Redaction(result=("token",), args=()),
        namespace="test",
        idempotency=idempotency,
    )


def test_strategy_params_naming_an_argument_the_tool_lacks_is_refused_at_registration():
    with pytest.raises(ToolRegistrationError, match="does not take: order_id"):
        check_contract(_contract(Idempotency(strategy="params", params=("order_id",))))


def test_strategy_none_on_an_external_side_effect_is_refused():
    with pytest.raises(ToolRegistrationError, match="strategy none is refused"):
        check_contract(_contract(Idempotency(strategy="none"), effect="external_side_effect"))


def test_the_admin_form_refuses_params_the_tool_lacks(test_tools):
    from apps.tools.admin import ToolForm

    tool = Tool.objects.get(pk=SLOW)
    data = {
        "enabled": True,
        "idempotency_strategy": "params",
        "idempotency_params": '["order_id"]',
        "idempotency_scope": "principal",
        "idempotency_ttl_s": 60,
        "retry_attempts": 0,
        "retry_backoff_ms": 0,
        "retry_jitter": 0,
    }
    form = ToolForm(data, instance=tool)

    assert not form.is_valid()
    assert "does not take: order_id" in str(form.errors)
    with pytest.raises(call_settings.CallSettingsError):
        call_settings.check("read_only", tool.input_schema, Idempotency(ttl_s=0), Retries())
