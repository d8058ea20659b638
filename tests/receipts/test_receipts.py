"""Every ended call carries a signed receipt: with its REST record, by its invocation id,
in its tool_call_result event, in wire batches and in /mcp/'s `_meta`; its body names
what ran (digests of the arguments and the redacted result), who asked, what decided
and how it ended, and it verifies against the published keys."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from toolhub_client import verify_receipt

from apps.invocations.models import InvocationRecord, RunEvent
from apps.mcp.server.methods import call_result
from apps.policies.models import Outcome, PolicyRule
from apps.receipts.body import digest
from apps.tools.models import Tool
from tests.conftest import Agent
from tests.receipts.support import parts, published_keys

pytestmark = pytest.mark.django_db

ECHO = "test__echo"
# secret_note is redacted from the record: the digest is of the arguments that ran.
ECHO_ARGS = {"text": "ship é", "secret_note": "s3"}


def test_an_ended_call_returns_a_receipt_that_verifies_against_the_published_keys(caller: Agent):
    response = caller.invoke(ECHO, args=ECHO_ARGS, runId="run-r", toolCallId="call-r")
    record = response.json()
    assert record["ok"] is True, record

    body = verify_receipt(record["receipt"], published_keys())

    tool = Tool.objects.get(pk=ECHO)
    assert body["kind"] == "call"
    assert body["invocationId"] == record["invocationId"]
    assert (body["toolCallId"], body["runId"]) == ("call-r", "run-r")
    assert (body["tenant"], body["principal"]) == ("acme", "agent:test")
    assert body["tool"] == {"id": ECHO, "schemaHash": tool.schema_hash}
    # The digests anyone can recompute: canonical JSON (sorted keys, no spaces, UTF-8).
    canonical = json.dumps(ECHO_ARGS, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert body["args"] == {"sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    assert body["resultSha256"] == digest(record["result"])
    assert body["decision"]["outcome"] == "allow"
    assert body["decision"]["rule"] == record["policyRule"]
    assert re.fullmatch(r"[0-9a-f]{16}", body["decision"]["policyVersion"])
    assert body["outcome"] == {"status": "succeeded", "ok": True, "errorCode": None}
    assert body["startedAt"] <= body["endedAt"] <= body["signedAt"]
    assert body["approval"] is None


def test_a_receipt_is_fetched_by_invocation_id_only_within_the_tenant(
    agent: Agent, stranger: Agent
):
    record = agent.invoke("core__get_current_time").json()
    url = f"/api/v1/invocations/{record['invocationId']}/receipt/"

    mine = agent.client.get(url)
    theirs = stranger.client.get(url)

    assert mine.status_code == 200, mine.content
    header, _, _ = parts(record["receipt"])
    assert mine.json() == {
        "invocationId": record["invocationId"],
        "kid": header["kid"],
        "receipt": record["receipt"],
        "decisions": [],
    }
    assert header["alg"] == "Ed25519" and header["typ"] == "toolhub-receipt"
    assert theirs.status_code == 404


def test_a_denied_call_has_a_receipt_naming_the_denial(bare_agent: Agent):
    record = bare_agent.invoke("core__get_current_time").json()

    body = verify_receipt(record["receipt"], published_keys())

    assert record["errorCode"] == "policy_denied"
    assert body["decision"]["outcome"] == "deny"
    assert body["decision"]["rule"] == "default:deny"
    assert body["outcome"] == {"status": "failed", "ok": False, "errorCode": "policy_denied"}
    assert body["resultSha256"] is None


def test_a_call_refused_for_its_arguments_names_no_argument_digest(caller: Agent):
    agent = caller
    record = agent.invoke(ECHO, args={"text": 3}).json()

    body = verify_receipt(record["receipt"], published_keys())

    assert body["outcome"]["errorCode"] == "validation"
    assert body["args"] == {"sha256": None}


def test_the_tool_call_result_event_carries_the_receipt(agent: Agent):
    record = agent.invoke("core__get_current_time", runId="run-ev").json()

    result = RunEvent.objects.get(run_id="run-ev", type="tool_call_result")

    assert result.message["receipt"] == record["receipt"]
    assert InvocationRecord.objects.get(pk=record["invocationId"]).receipt == record["receipt"]


def test_the_policy_version_changes_with_a_rule_and_names_the_deciding_rule(caller: Agent):
    agent = caller
    before = verify_receipt(agent.invoke(ECHO, args=ECHO_ARGS).json()["receipt"], published_keys())
    policy = agent.tenant.policies.get(name="test tools")
    rule = PolicyRule.objects.create(
        policy=policy,
        tool_pattern=ECHO,
        condition='args.text == "nope"',
        outcome=Outcome.DENY,
        description="no nope",
    )

    allowed = verify_receipt(agent.invoke(ECHO, args=ECHO_ARGS).json()["receipt"], published_keys())
    denied = verify_receipt(
        agent.invoke(ECHO, args={**ECHO_ARGS, "text": "nope"}).json()["receipt"],
        published_keys(),
    )

    assert allowed["decision"]["policyVersion"] != before["decision"]["policyVersion"]
    assert denied["decision"]["policyVersion"] == allowed["decision"]["policyVersion"]
    assert denied["decision"] == {
        "outcome": "deny",
        "rule": rule.label,
        "policyVersion": allowed["decision"]["policyVersion"],
    }


def test_an_openai_wire_batch_answers_each_ended_calls_receipt_beside_its_messages(
    agent: Agent,
):
    calls = [
        {"id": f"call_{n}", "type": "function",
         "function": {"name": "core__get_current_time", "arguments": "{}"}}
        for n in range(2)
    ]  # fmt: skip
    response = agent.client.post(
        "/api/v1/wire/openai/tool-calls/", {"toolCalls": calls}, format="json"
    )

    answer = response.json()
    assert response.status_code == 200, answer
    assert [r["toolCallId"] for r in answer["receipts"]] == ["call_0", "call_1"]
    keys = published_keys()
    for receipt in answer["receipts"]:
        body = verify_receipt(receipt["receipt"], keys)
        assert (body["toolCallId"], body["invocationId"]) == (
            receipt["toolCallId"],
            receipt["invocationId"],
        )
    assert all("receipt" not in m["content"] for m in answer["messages"])


def test_an_mcp_call_result_carries_the_receipt_in_meta_not_in_what_the_model_reads(
    agent: Agent,
):
    record = agent.invoke("core__get_current_time").json()

    result = call_result(InvocationRecord.objects.get(pk=record["invocationId"]))

    assert result["_meta"]["toolhub/receipt"] == record["receipt"]
    assert "receipt" not in result["structuredContent"]
    assert record["receipt"] not in result["content"][0]["text"]
